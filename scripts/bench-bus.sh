#!/usr/bin/env bash
# Bus benchmark: our bus (Swift, Codable, ~200-byte body) against raw libzmq (C, same frames and
# sizes), each as a DEALER client and a ROUTER echo server in two processes over tcp loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${BENCH_SECONDS:-3}

swift build -c release --product bus-bench >/dev/null
BIN=$(swift build -c release --show-bin-path)
mkdir -p .build/bench
cc -O2 -o .build/bench/zmq_echo Benchmarks/raw/zmq_echo.c $(pkg-config --libs libzmq)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

measure() { # measure SERVER_CMD CLIENT_CMD
  local endpoint="tcp://127.0.0.1:$(port)"
  $1 server "$endpoint" & local server=$!
  sleep 0.5
  local line
  line=$($2 client "$endpoint" "$SECONDS_EACH")
  kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null || true
  echo "$line"
}

raw=$(measure .build/bench/zmq_echo .build/bench/zmq_echo)
bus=$(measure "$BIN/bus-bench" "$BIN/bus-bench")
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
raw_lat=$(field "$raw" latency_us); raw_tp=$(field "$raw" throughput_rps)
bus_lat=$(field "$bus" latency_us); bus_tp=$(field "$bus" throughput_rps)

echo "raw libzmq  latency (1 in flight):  ${raw_lat} us"
echo "raw libzmq  throughput (64 in flight): ${raw_tp} req/s"
echo "bus         latency (1 in flight):  ${bus_lat} us"
echo "bus         throughput (64 in flight): ${bus_tp} req/s"
awk -v bl="$bus_lat" -v rl="$raw_lat" -v bt="$bus_tp" -v rt="$raw_tp" \
  'BEGIN { printf "bus/raw latency ratio: %.2f  bus/raw throughput ratio: %.2f\n", bl/rl, bt/rt }'
