#!/usr/bin/env bash
# Quota benchmark: durable reserve decisions through the bus (the quota service as it ships,
# WAL + synchronous=FULL, group commit) against an in-memory Redis limiter (one Lua script over a
# day and a month counter, redis-benchmark with EVALSHA, 32 connections, random users, no
# pipelining), in the same run on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${BENCH_SECONDS:-5}
CALLERS=${BENCH_CALLERS:-64}

command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null || {
  echo "installing redis-server (for the baseline)"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
}

source scripts/bench-lib.sh
build_release quota quota-bench

# Our quota service, durable.
endpoint="tcp://127.0.0.1:$(port)"
QUOTA_BIND=$endpoint DATA_DIR=$work LOG_LEVEL=warning QUOTA_MAX_IN_FLIGHT=4096 "$BIN/quota" &
pids+=($!)
sleep 1
quota=$("$BIN/quota-bench" "$endpoint" "$SECONDS_EACH" "$CALLERS")

# Redis with the Lua limiter.
redis_port=$(port)
redis-server --port "$redis_port" --save "" --appendonly no --daemonize no --loglevel warning &
pids+=($!)
for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
sha=$(redis-cli -p "$redis_port" SCRIPT LOAD "$(cat Benchmarks/quota-limiter.lua)")
requests=$(( SECONDS_EACH * 40000 ))
csv=$(redis-benchmark -p "$redis_port" -c 32 -n "$requests" -r 100000 -P 1 --csv \
  EVALSHA "$sha" 2 "day:__rand_int__" "month:__rand_int__" 20 600 86400 2678400 | tail -1)
redis_rps=$(echo "$csv" | cut -d, -f2 | tr -d '"')
redis_p50=$(echo "$csv" | cut -d, -f5 | tr -d '"')
redis_p99=$(echo "$csv" | cut -d, -f7 | tr -d '"')

field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
echo "quota service (bus, durable, $CALLERS callers): $(field "$quota" decisions_per_s) decisions/s  p50 $(field "$quota" p50_ms) ms  p99 $(field "$quota" p99_ms) ms"
echo "redis + Lua (in memory, 32 connections):       ${redis_rps} decisions/s  p50 ${redis_p50} ms  p99 ${redis_p99} ms"
awk -v q="$(field "$quota" decisions_per_s)" -v r="$redis_rps" 'BEGIN { printf "quota/redis decisions ratio: %.2f\n", q/r }'
