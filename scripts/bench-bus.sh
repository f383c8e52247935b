#!/usr/bin/env bash
# Bus benchmark: our bus (Swift, Codable, ~200-byte body) against raw libzmq (C, same frames and
# sizes), each as a DEALER client and a ROUTER echo server in two processes over tcp loopback.
# The ratio line compares the bus as most code calls it (tasks on the cooperative pool), and what
# encryption costs: the bus again with CURVE and callers known by key (a ZAP handler, roles
# checked), against the plain bus of the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${BENCH_SECONDS:-3}

scripts/swift-build.sh -c release --product bus-bench >/dev/null 2>&1 || scripts/swift-build.sh -c release --product bus-bench
BIN=$(scripts/swift-build.sh -c release --show-bin-path)
mkdir -p .build/bench
cc -O2 -o .build/bench/zmq_echo Benchmarks/raw/zmq_echo.c $(pkg-config --libs libzmq)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

measure() { # measure SERVER_CMD CLIENT_CMD: "zmq_echo bus" speaks the bus's frames from C
  local endpoint="tcp://127.0.0.1:$(port)"
  $1server "$endpoint" & local server=$!
  sleep 0.5
  local line
  line=$($2client "$endpoint" "$SECONDS_EACH")
  kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null || true
  echo "$line"
}

raw=$(measure ".build/bench/zmq_echo " ".build/bench/zmq_echo ")
bus=$(measure "$BIN/bus-bench " "$BIN/bus-bench ")
read -r server_public server_secret caller_public caller_secret <<< "$("$BIN/bus-bench" keys -)"
# exec: the background job is the server itself, so the kill below reaches it.
curve_server() { BUS_CURVE_SECRET=$server_secret BUS_CURVE_CLIENTS="gateway:$caller_public" exec "$BIN/bus-bench" server "$@"; }
curve_client() { BUS_BENCH_ECHO_ONLY=1 BUS_CURVE_PUBLIC=$server_public BUS_CURVE_KEY=$caller_secret "$BIN/bus-bench" client "$@"; }
curve=$(measure "curve_" "curve_")
swift_client=$(BUS_BENCH_ECHO_ONLY=1 measure ".build/bench/zmq_echo bus" "$BIN/bus-bench ")
hex_body=$("$BIN/bus-bench" body -)
c_bus_client() { .build/bench/zmq_echo busclient "$1" "$2" "$hex_body"; }  # with a binary body
swift_server=$(measure "$BIN/bus-bench " "c_bus_")
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
raw_lat=$(field "$raw" latency_us); raw_tp=$(field "$raw" throughput_rps)
bus_lat=$(field "$bus" latency_us); bus_tp=$(field "$bus" throughput_rps)

bus_exec_lat=$(field "$bus" executor_latency_us); bus_exec_tp=$(field "$bus" executor_throughput_rps)
bus_loop_lat=$(field "$bus" loop_latency_us); bus_loop_tp=$(field "$bus" loop_throughput_rps)
curve_lat=$(field "$curve" latency_us); curve_tp=$(field "$curve" throughput_rps)

echo "raw libzmq (C)                     latency, 1 in flight:    ${raw_lat} us"
echo "raw libzmq (C)                     throughput, 64 in flight: ${raw_tp} req/s"
echo "bus, callers on the pool           latency, 1 in flight:    ${bus_lat} us"
echo "bus, callers on the pool           throughput, 64 in flight: ${bus_tp} req/s"
echo "bus, callers on the client's thread latency, 1 in flight:    ${bus_exec_lat} us"
echo "bus, callers on the client's thread throughput, 64 in flight: ${bus_exec_tp} req/s"
echo "bus, callers on a NIO event loop   latency, 1 in flight:    ${bus_loop_lat} us"
echo "bus, callers on a NIO event loop   throughput, 64 in flight: ${bus_loop_tp} req/s"
echo "bus, quota's own messages           latency, 1 in flight:    $(field "$bus" reserve_latency_us) us"
echo "bus, quota's own messages           throughput, 64 in flight: $(field "$bus" reserve_throughput_rps) req/s (ReserveQuota $(field "$bus" reserve_bytes) bytes, QuotaDecision $(field "$bus" decision_bytes) bytes)"
echo "bus with CURVE, callers by key      latency, 1 in flight:    ${curve_lat} us"
echo "bus with CURVE, callers by key      throughput, 64 in flight: ${curve_tp} req/s"
echo "diagnostic: bus client vs C server  $(field "$swift_client" latency_us) us, $(field "$swift_client" throughput_rps) req/s"
echo "diagnostic: C client vs bus server  $(field "$swift_server" latency_us) us, $(field "$swift_server" throughput_rps) req/s"
echo "diagnostic: handler path alone (decode, handle, encode; binary and JSON): $("$BIN/bus-bench" handler -)"
awk -v bl="$bus_lat" -v rl="$raw_lat" -v bt="$bus_tp" -v rt="$raw_tp" -v cl="$curve_lat" -v ct="$curve_tp" \
  'BEGIN { printf "bus/raw latency ratio: %.2f  bus/raw throughput ratio: %.2f  curve/plain latency ratio: %.2f  curve/plain throughput ratio: %.2f\n", bl/rl, bt/rt, cl/bl, ct/bt }'
