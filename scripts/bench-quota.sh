#!/usr/bin/env bash
# Quota benchmark: durable reserve decisions through the bus (the quota service as it ships:
# decided in memory, each batch appended to its ledger's log and fdatasynced before the answers)
# against a Redis limiter (one Lua script over a day and a month counter, redis-benchmark with
# EVALSHA, 32 connections, random users, no pipelining), in memory and with `appendfsync always`
# (the same promise as ours), in the same run on this machine. Ends with
# `quota/redis decisions ratio: X` and `quota/redis-durable decisions ratio: Y`.
#
# STORE=postgres: the quota service on PostgreSQL instead (a PostgreSQL 15 of its own in the scratch
# folder, scripts/postgres-server.sh), with one and then two replicas (the bench client given both
# endpoints), against Redis + Lua with `appendfsync always` (the same promise: on disk before the
# answer). Ends with `quota-postgres/redis-fsync decisions ratio: 1 replica X, 2 replicas Y`.
# BENCH_PERF=DIR also records a perf profile of the whole machine during each run there, and
# PostgreSQL's costliest statements of each (DIR/statements-REPLICAS.txt).
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

field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# Redis with the Lua limiter: prints "rps p50 p99"; its own arguments after.
redis_limiter() {
  local redis_port csv sha
  redis_port=$(port)
  redis-server --port "$redis_port" --save "" --daemonize no --loglevel warning --dir "$work" "$@" >>"$work/redis.log" 2>&1 &
  local redis_pid=$!
  for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  sha=$(redis-cli -p "$redis_port" SCRIPT LOAD "$(cat Benchmarks/quota-limiter.lua)")
  csv=$(redis-benchmark -p "$redis_port" -c 32 -n $(( SECONDS_EACH * 40000 )) -r 100000 -P 1 --csv \
    EVALSHA "$sha" 2 "day:__rand_int__" "month:__rand_int__" 20 600 86400 2678400 | tail -1)
  kill "$redis_pid" 2>/dev/null; wait "$redis_pid" 2>/dev/null || true
  echo "$(echo "$csv" | cut -d, -f2 | tr -d '"') $(echo "$csv" | cut -d, -f5 | tr -d '"') $(echo "$csv" | cut -d, -f7 | tr -d '"')"
}

if [ "${STORE:-sqlite}" = postgres ]; then
  start_bench_postgres

  # The SQLite ledger, as `make bench-quota` runs it: the baseline.
  endpoint="tcp://127.0.0.1:$(port)"
  QUOTA_BIND=$endpoint DATA_DIR=$work LOG_LEVEL=warning QUOTA_MAX_IN_FLIGHT=4096 "$BIN/quota" &
  sqlite_pid=$!
  sleep 1
  out=$(profiled sqlite "$BIN/quota-bench" "$endpoint" "$SECONDS_EACH" "$CALLERS")
  kill "$sqlite_pid" 2>/dev/null; wait "$sqlite_pid" 2>/dev/null || true
  sqlite=$(field "$out" decisions_per_s)
  echo "quota on SQLite, 1 replica (bus, durable, $CALLERS callers):    $sqlite decisions/s  p50 $(field "$out" p50_ms) ms  p99 $(field "$out" p99_ms) ms"

  results=()
  for replicas in 1 2; do
    endpoints=""
    started=()
    for index in $(seq 1 "$replicas"); do
      endpoint="tcp://127.0.0.1:$(port)"
      endpoints+="${endpoints:+,}$endpoint"
      QUOTA_BIND=$endpoint DATA_DIR=$work QUOTA_DATABASE_URL=$POSTGRES_URL LOG_LEVEL=warning QUOTA_MAX_IN_FLIGHT=4096 "$BIN/quota" &
      started+=($!)
    done
    sleep 2
    before=$(statements)
    out=$(profiled "postgres-$replicas" "$BIN/quota-bench" "$endpoints" "$SECONDS_EACH" "$CALLERS")
    after=$(statements)
    top_statements "statements-$replicas.txt"
    kill "${started[@]}" 2>/dev/null; wait "${started[@]}" 2>/dev/null || true
    # Every statement the replicas sent while the bench ran (BEGIN and COMMIT included), over
    # every reservation it made (its 200 warm-up ones too).
    decisions=$(field "$out" admitted); decisions=$(( decisions + $(field "$out" denied) + 200 ))
    trips=$(awk -v s=$(( after - before )) -v d="$decisions" 'BEGIN { printf "%.3f", s / d }')
    echo "quota on PostgreSQL, $replicas replica(s) (bus, durable, $CALLERS callers): $(field "$out" decisions_per_s) decisions/s  p50 $(field "$out" p50_ms) ms  p99 $(field "$out" p99_ms) ms  $trips round trips/decision"
    results+=("$(field "$out" decisions_per_s)")
  done
  read -r fsync_rps fsync_p50 fsync_p99 <<< "$(redis_limiter --appendonly yes --appendfsync always)"
  echo "redis + Lua (appendfsync always, 32 connections):   ${fsync_rps} decisions/s  p50 ${fsync_p50} ms  p99 ${fsync_p99} ms"
  awk -v a="${results[0]}" -v b="${results[1]}" -v r="$fsync_rps" \
    'BEGIN { printf "quota-postgres/redis-fsync decisions ratio: 1 replica %.2f, 2 replicas %.2f\n", a/r, b/r }'
  awk -v a="${results[0]}" -v b="${results[1]}" -v r="$sqlite" \
    'BEGIN { printf "quota-postgres/sqlite decisions ratio: 1 replica %.2f, 2 replicas %.2f\n", a/r, b/r }'
  exit 0
fi

# Our quota service, durable.
endpoint="tcp://127.0.0.1:$(port)"
QUOTA_BIND=$endpoint DATA_DIR=$work LOG_LEVEL=warning QUOTA_MAX_IN_FLIGHT=4096 "$BIN/quota" &
pids+=($!)
sleep 1
quota=$("$BIN/quota-bench" "$endpoint" "$SECONDS_EACH" "$CALLERS")

# Redis with the Lua limiter: in memory, and with every write fsynced before its answer
# (`appendfsync always`: the promise ours keeps).
read -r redis_rps redis_p50 redis_p99 <<< "$(redis_limiter --appendonly no)"
read -r fsync_rps fsync_p50 fsync_p99 <<< "$(redis_limiter --appendonly yes --appendfsync always)"
echo "quota service (bus, durable, $CALLERS callers): $(field "$quota" decisions_per_s) decisions/s  p50 $(field "$quota" p50_ms) ms  p99 $(field "$quota" p99_ms) ms"
echo "redis + Lua (in memory, 32 connections):       ${redis_rps} decisions/s  p50 ${redis_p50} ms  p99 ${redis_p99} ms"
echo "redis + Lua (appendfsync always, 32 conns):    ${fsync_rps} decisions/s  p50 ${fsync_p50} ms  p99 ${fsync_p99} ms"
awk -v q="$(field "$quota" decisions_per_s)" -v r="$redis_rps" 'BEGIN { printf "quota/redis decisions ratio: %.2f\n", q/r }'
awk -v q="$(field "$quota" decisions_per_s)" -v r="$fsync_rps" 'BEGIN { printf "quota/redis-durable decisions ratio: %.2f\n", q/r }'
