#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver for scripts/trace-check.sh: takes `POST /v1/traces` bodies as the
OpenTelemetry protocol defines them (an ExportTraceServiceRequest in protobuf, maybe gzipped),
decodes them with the protocol's own Python bindings (PyPI's opentelemetry-proto), and appends
one JSON object a span to OUTPUT: service (the resource's service.name), name, kind, trace id,
span id and parent span id (hex), status code, and the span's string attributes. Anything that
is not a valid request is answered 400 and counted in OUTPUT as {"invalid": reason}.

usage: otlp-receiver.py PORT OUTPUT
"""
import gzip
import http.server
import json
import sys

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

port, output = int(sys.argv[1]), sys.argv[2]


def attributes(items):
    return {item.key: item.value.string_value for item in items if item.value.HasField("string_value")}


class Receiver(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def record(self, lines):
        with open(output, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            if self.path != "/v1/traces":
                raise ValueError(f"path {self.path}")
            if self.headers.get("Content-Type") != "application/x-protobuf":
                raise ValueError(f"content type {self.headers.get('Content-Type')}")
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
        except Exception as error:  # noqa: BLE001 - answered and recorded
            self.record([{"invalid": str(error)}])
            self.send_response(400)
            self.end_headers()
            return
        spans = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append({
                        "service": resource.get("service.name", ""),
                        "instance": resource.get("service.instance.id", ""),
                        "name": span.name,
                        "kind": span.kind,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "status": span.status.code,
                        "attributes": attributes(span.attributes),
                        "links": [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()} for link in span.links],
                    })
        self.record(spans)
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


http.server.ThreadingHTTPServer(("127.0.0.1", port), Receiver).serve_forever()
