#!/usr/bin/env bash
# Quota benchmark: durable reserve decisions through the bus (the quota service as it ships:
# decided in memory, each batch appended to its ledger's log and fdatasynced before the answers)
# against a Redis limiter (one Lua script over a day and a month counter, redis-benchmark with
# EVALSHA, 32 connections, random users, no pipelining), in memory and with `appendfsync always`
# (the same promise as ours), in the same run on this machine. Ends with
# `quota/redis decisions ratio: X` and `quota/redis-durable decisions ratio: Y`.
#
# STORE=postgres: the quota service on PostgreSQL instead (a PostgreSQL 15 of its own in the scratch
# folder, scripts/postgres-server.sh), with one and with two replicas (the bench client given both
# endpoints), against the SQLite ledger and against Redis + Lua with `appendfsync always` (the
# same promise: on disk before the answer). The SQLite ledger and the two setups on PostgreSQL are
# measured in turns, $BENCH_ROUNDS times (3), each figure the median of its turns. Ends with
# `quota-postgres/sqlite decisions ratio: 1 replica X, 2 replicas Y`.
# BENCH_PERF=DIR also records a perf profile of the whole machine during each run there, and
# PostgreSQL's costliest statements of each (DIR/statements-REPLICAS-ROUND.txt).
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
  ROUNDS=${BENCH_ROUNDS:-3}

  # The SQLite ledger (as `make bench-quota` runs it: the baseline), one replica on PostgreSQL and
  # two, all started first and then measured in turns, $ROUNDS times: this machine's speed drifts
  # by a third within minutes (one binary measured 4,590 to 6,870 decisions/s in one session),
  # which one store measured after the other read as a difference of the stores. Each figure is
  # the median of its turns.
  declare -A endpoints=()
  start_quota() { # SETUP NAME [database URL]: starts a replica of SETUP, adds its endpoint to SETUP's
    local endpoint="tcp://127.0.0.1:$(port)"
    mkdir -p "$work/$2"
    QUOTA_BIND=$endpoint DATA_DIR=$work/$2 QUOTA_DATABASE_URL=${3:-} LOG_LEVEL=warning QUOTA_MAX_IN_FLIGHT=4096 "$BIN/quota" &
    pids+=($!)
    endpoints[$1]+="${endpoints[$1]:+,}$endpoint"
  }
  start_quota sqlite sqlite
  start_quota postgres-1 postgres-1 "$POSTGRES_URL"
  start_quota postgres-2 postgres-2a "$POSTGRES_URL"
  start_quota postgres-2 postgres-2b "$POSTGRES_URL"
  sleep 2
  declare -A rates=() p50s=() p99s=() trips=()
  for round in $(seq 1 "$ROUNDS"); do
    for setup in sqlite postgres-1 postgres-2; do
      before=$(statements)
      out=$(profiled "$setup-$round" "$BIN/quota-bench" "${endpoints[$setup]}" "$SECONDS_EACH" "$CALLERS")
      after=$(statements)
      rates[$setup]+=" $(field "$out" decisions_per_s)"
      p50s[$setup]+=" $(field "$out" p50_ms)"
      p99s[$setup]+=" $(field "$out" p99_ms)"
      [ "$setup" != sqlite ] || continue
      top_statements "statements-${setup#postgres-}-$round.txt"
      # Every statement PostgreSQL ran while the bench did (BEGIN and COMMIT included), over every
      # reservation it made (its 200 warm-up ones too).
      decisions=$(( $(field "$out" admitted) + $(field "$out" denied) + 200 ))
      trips[$setup]+=" $(awk -v s=$(( after - before )) -v d="$decisions" 'BEGIN { printf "%.3f", s / d }')"
    done
  done
  median() { echo "$@" | tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
  echo "quota decisions over the bus, durable, $CALLERS callers; median of $ROUNDS turns of ${SECONDS_EACH}s (each turn's figure in brackets):"
  for setup in sqlite postgres-1 postgres-2; do
    case $setup in
      sqlite) label="quota on SQLite, 1 replica:    " ;;
      postgres-1) label="quota on PostgreSQL, 1 replica:" ;;
      postgres-2) label="quota on PostgreSQL, 2 replicas:" ;;
    esac
    line="$label $(median ${rates[$setup]}) decisions/s [${rates[$setup]# }]  p50 $(median ${p50s[$setup]}) ms  p99 $(median ${p99s[$setup]}) ms"
    [ "$setup" = sqlite ] || line+="  $(median ${trips[$setup]}) round trips/decision"
    echo "$line"
  done
  sqlite=$(median ${rates[sqlite]})
  one=$(median ${rates[postgres-1]})
  two=$(median ${rates[postgres-2]})
  read -r fsync_rps fsync_p50 fsync_p99 <<< "$(redis_limiter --appendonly yes --appendfsync always)"
  echo "redis + Lua (appendfsync always, 32 connections):   ${fsync_rps} decisions/s  p50 ${fsync_p50} ms  p99 ${fsync_p99} ms"
  awk -v a="$one" -v b="$two" -v r="$fsync_rps" \
    'BEGIN { printf "quota-postgres/redis-fsync decisions ratio: 1 replica %.2f, 2 replicas %.2f\n", a/r, b/r }'
  awk -v a="$one" -v b="$two" -v r="$sqlite" \
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
