// swift-tools-version:6.2
import CompilerPluginSupport
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
]

/// The server's own library modules, in release builds, carry their function bodies in their
/// module files (`-cross-module-optimization`), so that the modules calling them inline and
/// specialize them. Without it, generic code of one module called from another ran unspecialized:
/// the jobs dispatcher's state machine (`DispatchStateMachine<BusChannel.Peer>`, JobsCore, driven
/// from JobsService) and BinaryWire's readers under every message's coder, with generic metadata
/// looked up at run time (4% of the jobs process in `bench-jobs`, perf). Measured with
/// `scripts/bench-side-by-side.sh`: no-op jobs 1.20 and 1.21 times as fast (medians of 3 and 5
/// rounds, faster in each). The cost is compile time: a release build of every product took
/// 18 minutes here. Debug builds (the tests, `make run`) are unchanged. An unsafe flag makes the
/// products containing its target unusable by other packages (PackageDescription's
/// `unsafeFlags`); PhotoEditKit, the product apps depend on, contains none of these targets.
/// Release builds also leave exclusive access to the compiler's static checks
/// (`-enforce-exclusivity=unchecked`): the run-time checks were about 1% of the machine on the
/// bus's hot paths, and debug builds, which the suite runs, keep them (docs/architecture.md).
let crossModuleSettings: [SwiftSetting] = swiftSettings + [.unsafeFlags(["-cross-module-optimization", "-enforce-exclusivity=unchecked"], .when(configuration: .release))]

let package = Package(
    name: "photoedit-backend",
    platforms: [.macOS(.v15), .iOS(.v17)],
    products: [
        // The app's side: the client library (Foundation only).
        .library(name: "PhotoEditKit", targets: ["PhotoEditKit"]),
        .executable(name: "photoedit", targets: ["photoedit"]),
        .executable(name: "gateway", targets: ["gateway"]),
        .executable(name: "quota", targets: ["quota"]),
        .executable(name: "history", targets: ["history"]),
        .executable(name: "jobs", targets: ["jobs"]),
        .executable(name: "worker", targets: ["worker"]),
        .executable(name: "loadtest", targets: ["loadtest"]),
        .executable(name: "bus-bench", targets: ["bus-bench"]),
        .executable(name: "bus-fixture", targets: ["bus-fixture"]),
        .executable(name: "provider-fixture", targets: ["provider-fixture"]),
        .executable(name: "push-fixture", targets: ["push-fixture"]),
        .executable(name: "slow-crowd", targets: ["slow-crowd"]),
        .executable(name: "quota-bench", targets: ["quota-bench"]),
        .executable(name: "jobs-bench", targets: ["jobs-bench"]),
        .executable(name: "history-bench", targets: ["history-bench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.2.2"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.8.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", "4.0.0"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-openapi-runtime.git", from: "1.13.4"),
        .package(url: "https://github.com/apple/swift-openapi-urlsession.git", from: "1.4.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift.git", from: "0.2.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
        // Traces over OTLP/HTTP only: the gRPC exporter (its default trait) would add gRPC's
        // packages to every build for an exporter nobody configures here.
        .package(url: "https://github.com/swift-otel/swift-otel.git", from: "1.6.0", traits: ["OTLPHTTP"]),
        // Only `make generate` builds it: the client's code is generated once and committed.
        .package(url: "https://github.com/apple/swift-openapi-generator.git", from: "1.14.3"),
        // For `@BinaryMessage`, the macro that writes the messages' binary coders.
        .package(url: "https://github.com/swiftlang/swift-syntax.git", from: "603.0.0"),
    ],
    targets: [
        // libzmq through pkg-config; the only C module the bus uses.
        .systemLibrary(
            name: "Clibzmq",
            path: "Shared/Clibzmq",
            pkgConfig: "libzmq",
            providers: [.apt(["libzmq3-dev"])]
        ),
        // The Swift binding of libzmq: the one module that calls zmq_*.
        .target(
            name: "ZeroMQ",
            dependencies: ["Clibzmq"],
            path: "Shared/ZeroMQ",
            swiftSettings: crossModuleSettings
        ),
        // The bus's binary form of `Codable` values, and the fields of the messages that write
        // and read it themselves (`BinaryDirectCodable`, generated by `@BinaryMessage`).
        .target(
            name: "BinaryWire",
            dependencies: ["MessageMacros"],
            path: "Shared/BinaryWire",
            swiftSettings: crossModuleSettings
        ),
        // The compiler plugin behind `@BinaryMessage`: a message's binary coder from its fields.
        // No test target depends on it or imports swift-syntax: a test target that depends on a
        // macro target has SwiftPM build the tests, and every module they use (NIO, both
        // BoringSSLs, Hummingbird, GRDB...), a second time for the host, and one that imports
        // swift-syntax has it compile swift-syntax's modules a second time beside the plugin's.
        // The expansion tests run the compiler with the built plugin instead
        // (Tests/SystemTests/MacroExpansionTests.swift).
        .macro(
            name: "MessageMacros",
            dependencies: [
                .product(name: "SwiftSyntax", package: "swift-syntax"),
                .product(name: "SwiftSyntaxMacros", package: "swift-syntax"),
                .product(name: "SwiftCompilerPlugin", package: "swift-syntax"),
            ],
            path: "Shared/MessageMacros",
            swiftSettings: swiftSettings
        ),
        // Codable message types, method descriptors and the wire error type.
        .target(
            name: "Messages",
            dependencies: ["BinaryWire", "MessageMacros"],
            path: "Shared/Messages",
            swiftSettings: crossModuleSettings
        ),
        // Threads of their own for blocking work, off the cooperative pool: `IOThread`, and
        // `BatchThread`, a bounded queue served in batches (the group committer, the quota ledger),
        // and `BlockingThreads`, a bounded queue served by a few threads (a store's reads, a
        // worker's libvips calls).
        .target(
            name: "Threads",
            dependencies: [.product(name: "DequeModule", package: "swift-collections")],
            path: "Shared/Threads",
            swiftSettings: crossModuleSettings
        ),
        // Request/reply over ZeroMQ: ROUTER servers, DEALER clients, deadlines, backpressure.
        .target(
            name: "Bus",
            dependencies: [
                "ZeroMQ", "Messages", "BinaryWire", "Threads",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Shared/Bus",
            swiftSettings: crossModuleSettings
        ),
        // What every service process shares: configuration, logging, lifecycle, the health method.
        .target(
            name: "ServiceKit",
            dependencies: [
                "Bus", "Messages", "ZeroMQ", "Threads",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "OTel", package: "swift-otel"),
            ],
            path: "Shared/ServiceKit",
            swiftSettings: crossModuleSettings
        ),
        // Apple App Attest: a guest's attestation checked against Apple's root (CBOR, X.509).
        .target(
            name: "AppAttest",
            dependencies: [
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            path: "Shared/AppAttest",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "GatewayApp",
            dependencies: [
                "Bus", "Messages", "ServiceKit", "Blobs", "AppAttest",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/gateway/App",
            swiftSettings: crossModuleSettings
        ),
        .executableTarget(
            name: "gateway",
            dependencies: [
                "GatewayApp", "ServiceKit",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/gateway/Main",
            swiftSettings: swiftSettings
        ),
        // Quota: pure rules (plans, calendar windows, decisions), then storage and bus handler.
        .target(
            name: "QuotaCore",
            dependencies: ["Messages"],
            path: "Services/quota/Core",
            swiftSettings: crossModuleSettings
        ),
        // Opening a service's SQLite file durably (WAL, synchronous=FULL), group commit, background checkpoints.
        .target(
            name: "Storage",
            dependencies: [
                "Messages", "Bus", "Threads", .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            path: "Shared/Storage",
            swiftSettings: crossModuleSettings
        ),
        .target(
            name: "QuotaService",
            dependencies: [
                "QuotaCore", "Messages", "Bus", "ServiceKit", "Storage", "Threads",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Services/quota/Service",
            swiftSettings: crossModuleSettings
        ),
        .executableTarget(
            name: "quota",
            dependencies: ["QuotaService", "ServiceKit", "Storage", "Bus", .product(name: "ServiceLifecycle", package: "swift-service-lifecycle")],
            path: "Services/quota/Main",
            swiftSettings: swiftSettings
        ),
        // History: pure rules (tokens, month sections, retention), then storage, handler, sweeps.
        .target(
            name: "HistoryCore",
            dependencies: ["Messages", .product(name: "Crypto", package: "swift-crypto")],
            path: "Services/history/Core",
            swiftSettings: crossModuleSettings
        ),
        .target(
            name: "HistoryService",
            dependencies: [
                "HistoryCore", "Messages", "Bus", "ServiceKit", "Storage",
                .product(name: "GRDB", package: "GRDB.swift"),
                // SQLite's C interface: a page's JSON is written from the statement's columns.
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Services/history/Service",
            swiftSettings: crossModuleSettings
        ),
        // Each target names every module of ours it imports, also one it could reach through
        // another: SwiftPM rebuilds a target when a module it names changes, and a release build
        // compiles another module's class sizes into the code that creates its objects. history's
        // main.swift made its BusClients while only HistoryService was named: adding a stored
        // property to BusClient left it compiled with the old size in incremental release builds,
        // which then crashed at start or stop with "double free or corruption" (a fresh build was
        // right). `make test`'s debug builds do not inline across modules and never showed it.
        .executableTarget(
            name: "history",
            dependencies: ["HistoryService", "ServiceKit", "Storage", "Bus"],
            path: "Services/history/Main",
            swiftSettings: swiftSettings
        ),
        // Jobs: pure rules (job lifecycle, dispatch state machine, fair queue, effect catalogue),
        // then storage and the dispatcher that does their I/O, and the workers.
        .target(
            name: "JobsCore",
            dependencies: [
                "Messages",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "HeapModule", package: "swift-collections"),
            ],
            path: "Services/jobs/Core",
            swiftSettings: crossModuleSettings
        ),
        .target(
            name: "JobsService",
            dependencies: [
                "JobsCore", "Messages", "Bus", "ServiceKit", "Storage", "Blobs",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            path: "Services/jobs/Service",
            swiftSettings: crossModuleSettings
        ),
        .executableTarget(
            name: "jobs",
            dependencies: ["JobsService", "JobsCore", "ServiceKit", "Storage", "Bus", "Blobs"],
            path: "Services/jobs/Main",
            swiftSettings: swiftSettings
        ),
        .systemLibrary(
            name: "Cvips",
            path: "Shared/Cvips",
            pkgConfig: "vips",
            providers: [.apt(["libvips-dev"])]
        ),
        .systemLibrary(
            name: "CXattr",
            path: "Shared/CXattr"
        ),
        .target(
            name: "ImageOps",
            dependencies: ["Cvips"],
            path: "Services/jobs/ImageOps",
            // libjpeg (libjpeg62-turbo, which libvips itself uses) for JPEG thumbnails.
            linkerSettings: [.linkedLibrary("jpeg")]
        ),
        .target(
            name: "WorkerKit",
            dependencies: [
                "ImageOps", "Blobs", "JobsCore", "Messages", "Bus", "ServiceKit", "Threads",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            path: "Services/jobs/Worker",
            swiftSettings: crossModuleSettings
        ),
        .executableTarget(
            name: "worker",
            dependencies: ["WorkerKit", "JobsCore", "ServiceKit", "ZeroMQ"],
            path: "Services/jobs/WorkerMain",
            swiftSettings: swiftSettings
        ),
        // Blobs (uploads, results, thumbnails) in a folder or an S3-compatible bucket, AWS
        // Signature V4, and the signed URLs that reach them.
        .target(
            name: "Blobs",
            dependencies: [
                "Messages",
                "CXattr",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Shared/Blobs",
            swiftSettings: crossModuleSettings
        ),
        .executableTarget(
            name: "bus-bench",
            dependencies: [
                "Bus", "Messages", "BinaryWire", "ServiceKit", "ZeroMQ",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Benchmarks/bus-bench",
            swiftSettings: swiftSettings
        ),
        // The baseline of `make bench-gateway`: a bare Hummingbird route.
        .executableTarget(
            name: "bench-bare",
            dependencies: [.product(name: "Hummingbird", package: "hummingbird"), .product(name: "Logging", package: "swift-log")],
            path: "Benchmarks/bench-bare",
            swiftSettings: swiftSettings
        ),
        // A local stand-in for Gemini, OpenAI and fal (tests, `make bench-models`, `make run`).
        .executableTarget(
            name: "provider-fixture",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/Fixtures/provider-fixture",
            swiftSettings: swiftSettings
        ),
        // APNs and FCM as they answer, for the push notification tests.
        .executableTarget(
            name: "push-fixture",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdHTTP2", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/Fixtures/push-fixture",
            swiftSettings: swiftSettings
        ),
        // Slow clients held in a process of their own for the gateway's slow-client tests.
        .executableTarget(
            name: "slow-crowd",
            path: "Tests/Fixtures/slow-crowd",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "bus-fixture",
            dependencies: ["Bus", "Messages", "ServiceKit"],
            path: "Tests/Fixtures/bus-fixture",
            swiftSettings: swiftSettings
        ),
        // The client library the app (and `photoedit`) use: Foundation only.
        .target(
            name: "PhotoEditKit",
            dependencies: [
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
                .product(name: "OpenAPIURLSession", package: "swift-openapi-urlsession"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ],
            path: "Clients/PhotoEditKit",
            swiftSettings: swiftSettings
        ),
        // The command-line client, on the library.
        .executableTarget(
            name: "photoedit",
            dependencies: [
                "PhotoEditKit", "Messages",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            path: "Clients/photoedit",
            swiftSettings: swiftSettings
        ),
        // Drives the app's flows through the gateway and checks the system's promises after.
        .executableTarget(
            name: "loadtest",
            dependencies: [
                "Messages", "Blobs", "Threads",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "JWTKit", package: "jwt-kit"),
            ],
            path: "Tools/loadtest",
            swiftSettings: swiftSettings
        ),
        // What the test suites share: the test PostgreSQL the scripts start.
        .target(
            name: "TestSupport",
            dependencies: [
                "Bus", "Storage",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/TestSupport",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "LoadTestTests",
            dependencies: ["loadtest", "Blobs", .product(name: "Histogram", package: "hdrhistogram-swift")],
            path: "Tests/LoadTestTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "PhotoEditKitTests",
            dependencies: ["PhotoEditKit"],
            path: "Tests/PhotoEditKitTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "AppAttestTests",
            dependencies: ["AppAttest", .product(name: "Crypto", package: "swift-crypto"), .product(name: "X509", package: "swift-certificates")],
            path: "Tests/AppAttestTests",
            exclude: ["Fixtures"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BlobsTests",
            dependencies: ["Blobs"],
            path: "Tests/BlobsTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "BusTests",
            dependencies: [
                "Bus", "Messages", "BinaryWire", "ZeroMQ", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Tests/BusTests",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "quota-bench",
            dependencies: ["Bus", "Messages", "ServiceKit"],
            path: "Benchmarks/quota-bench",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "jobs-bench",
            dependencies: ["Bus", "Messages", "ServiceKit", "Blobs"],
            path: "Benchmarks/jobs-bench",
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "history-bench",
            dependencies: [
                "HistoryService", "Messages", "Storage", .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "PostgresNIO", package: "postgres-nio"), .product(name: "Logging", package: "swift-log"),
            ],
            path: "Benchmarks/history-bench",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "JobsTests",
            dependencies: [
                "JobsCore", "JobsService", "WorkerKit", "Messages", "Bus", "Blobs", "ServiceKit", "Storage", "TestSupport",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            path: "Tests/JobsTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "HistoryTests",
            dependencies: [
                "HistoryCore", "HistoryService", "Messages", "Bus", "Storage", "ServiceKit", "TestSupport",
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            path: "Tests/HistoryTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "QuotaTests",
            dependencies: [
                "QuotaCore", "QuotaService", "Messages", "Bus", "Storage", "Threads", "TestSupport",
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            path: "Tests/QuotaTests",
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "SystemTests",
            dependencies: [
                "TestSupport", .product(name: "PostgresNIO", package: "postgres-nio"),
                "Bus", "Messages", "ZeroMQ", "ServiceKit", "Storage", "GatewayApp", "AppAttest", "QuotaService", "JobsService", "HistoryService", "WorkerKit", "JobsCore", "ImageOps", "Blobs", "CXattr",
                "PhotoEditKit",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
            ],
            path: "Tests/SystemTests",
            swiftSettings: swiftSettings
        ),
    ]
)
