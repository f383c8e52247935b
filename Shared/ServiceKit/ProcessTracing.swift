import Bus
import Foundation
import Logging
import OTel
import ServiceLifecycle
import Tracing

/// Traces of this process, exported over OTLP/HTTP when the standard OpenTelemetry variables
/// ask for them, and nothing otherwise.
///
/// Tracing is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is
/// set, or `OTEL_TRACES_EXPORTER` names `otlp` or `console`; `OTEL_SDK_DISABLED=true` turns it
/// off. The rest is swift-otel's reading of the specification's variables: `OTEL_SERVICE_NAME`
/// (default: the process's kind, `gateway`, `quota`, `worker`...), `OTEL_RESOURCE_ATTRIBUTES`,
/// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (default `parentbased_always_on`: a
/// request the app sampled is traced throughout), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*`.
/// Logs and metrics stay where they are (standard output, `/metrics`).
public enum ProcessTracing {
    /// Bootstraps the tracer when the environment asks for traces; returns the service that
    /// exports them (run it first in the process's service group, so that it stops last and
    /// flushes what the others recorded), or nil.
    public static func bootstrap(
        service: String, instance: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment, logger: Logger
    ) throws -> (any Service)? {
        guard isRequested(environment) else { return nil }
        var configuration = OTel.Configuration.default
        configuration.serviceName = service
        if let instance { configuration.resourceAttributes["service.instance.id"] = instance }
        configuration.logs.enabled = false
        configuration.metrics.enabled = false
        configuration.traces.enabled = true
        configuration.diagnosticLogger = .custom(logger)
        configuration.diagnosticLogLevel = .warning
        let backend = try OTel.makeTracingBackend(configuration: configuration)
        InstrumentationSystem.bootstrap(backend.factory)
        BusTracing.enabled = true
        // The collector's address only: a URL may carry credentials, the headers carry keys.
        let endpoint = (environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] ?? environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
            .flatMap { URLComponents(string: $0) }
            .map { "\($0.scheme ?? "http")://\($0.host ?? "?")\($0.port.map { ":\($0)" } ?? "")" } ?? "the default (localhost:4318)"
        logger.info("exporting traces", metadata: ["collector": "\(endpoint)"])
        return backend.service
    }

    /// Whether the variables ask for traces.
    public static func isRequested(_ environment: [String: String]) -> Bool {
        if environment["OTEL_SDK_DISABLED"]?.lowercased() == "true" { return false }
        let endpoints = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].contains { !(environment[$0] ?? "").isEmpty }
        let exporters = (environment["OTEL_TRACES_EXPORTER"] ?? "").lowercased().split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        if exporters.contains("none") { return false }
        return endpoints || exporters.contains("otlp") || exporters.contains("console")
    }
}
