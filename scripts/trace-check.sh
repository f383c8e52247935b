#!/usr/bin/env bash
# Traces end to end: a stack of the debug build (quota, history, jobs, a worker, the gateway)
# exporting over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT) to scripts/otlp-receiver.py, which
# decodes the real protobuf with PyPI's opentelemetry-proto (installed if missing, pinned). An
# edit is created with the app's W3C `traceparent` and run to completion; then
# scripts/trace-check.py checks the spans: one trace, the app's continued, every parent link
# right, each bus call's span the parent of its handler's in the service that handled it, and
# the gateway, quota, jobs and the worker in it, and the gateway's JSON log lines of the request
# carrying the trace id. A request without `traceparent` starts a trace of its own. Without the variables nothing is exported (the rest of `make test` runs so).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
OTLP_PROTO_VERSION=1.45.2
if ! python3 -c "import opentelemetry.proto.collector.trace.v1.trace_service_pb2" 2>/dev/null; then
  pip_install "opentelemetry-proto==$OTLP_PROTO_VERSION"
fi
receiver_port=$(port)
python3 scripts/otlp-receiver.py "$receiver_port" "$work/spans.jsonl" > "$work/receiver.log" 2>&1 & pids+=($!)
# Listening before the processes start: a batch exported to nobody is dropped, not retried.
for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$receiver_port/" && break; sleep 0.1; done

export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$receiver_port" OTEL_BSP_SCHEDULE_DELAY=100
# The gateway's lines in JSON at debug: those written inside a span carry its trace id.
GATEWAY_ENV=(LOG_FORMAT=json LOG_LEVEL=debug)
start_debug_stack

if ! python3 scripts/trace-check.py "$gateway" "$work/spans.jsonl" Tests/Fixtures/images/photo.jpg "$work/gateway.log"; then
  for name in gateway jobs worker; do echo "$name's log:"; tail -10 "$work/$name.log"; done
  exit 1
fi
