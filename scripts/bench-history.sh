#!/usr/bin/env bash
# History benchmark: a history database of $ITEMS items (default 1,000,000) for $USERS users
# (10,000), one of whom has $BIG_ITEMS (100,000); quota, history, jobs and the gateway built for
# release; wrk at 32 connections against the gateway's /healthz (the baseline) and, through the
# gateway, a typical user's first page, a cursor page deep in the large history, an offset page
# at 5,000, and a substring search, all in the same run. STORE=postgres: that run on SQLite, then
# the same history in a PostgreSQL of its own (start_bench_postgres), history on it, and the ratio
# of the two (`history-postgres/sqlite throughput ratio: ...`) with PostgreSQL's statements per
# request.
# BENCH_PERF=DIR also records a perf profile of the whole machine during each measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_SECONDS:-10}
ITEMS=${ITEMS:-1000000}
USERS=${USERS:-10000}
BIG_ITEMS=${BIG_ITEMS:-100000}

source scripts/bench-lib.sh
need wrk wrk
build_release quota history jobs gateway history-bench

# Fills history on $1 (sqlite or postgres), starts the services and the gateway on it, measures
# each route, stops them; sets the route's figures in results_$1_ROUTE ("req/s p50 p99").
bench_store() {
  local store=$1 dir="$work/$1" url
  mkdir -p "$dir"
  echo "filling a history of $ITEMS items ($USERS users, one with $BIG_ITEMS; store: $store)..."
  if [ "$store" = postgres ]; then
    export HISTORY_DATABASE_URL=$POSTGRES_URL
    "$BIN/history-bench" fill-postgres "$POSTGRES_URL" "$USERS" "$ITEMS" "$BIG_ITEMS" | tail -1
  else
    unset HISTORY_DATABASE_URL
    "$BIN/history-bench" fill "$dir/history.sqlite" "$USERS" "$ITEMS" "$BIG_ITEMS" | tail -1
  fi

  export DATA_DIR=$dir LOG_LEVEL=warning
  export QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" HISTORY_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_ENDPOINT="tcp://127.0.0.1:$(port)"
  export QUOTA_BIND=$QUOTA_ENDPOINT HISTORY_BIND=$HISTORY_ENDPOINT JOBS_BIND=$JOBS_ENDPOINT JOBS_WORKER_BIND="tcp://127.0.0.1:$(port)"
  export GATEWAY_PORT=$(port) JWT_SECRET="bench-history-jwt-secret-0123456789abcdef" ADMIN_TOKEN=bench
  local started=()
  for name in quota history jobs gateway; do "$BIN/$name" & started+=($!); done
  pids+=("${started[@]}")
  url="http://127.0.0.1:$GATEWAY_PORT"
  for _ in $(seq 1 100); do curl -fsS "$url/readyz" >/dev/null 2>&1 && break; sleep 0.2; done

  local small big cursor before=0
  small=$("$BIN/history-bench" token "$JWT_SECRET" user-00042)
  big=$("$BIN/history-bench" token "$JWT_SECRET" user-big)
  cursor=$(curl -fsS -H "Authorization: Bearer $big" "$url/api/v1/history?limit=50&offset=90000" |
    python3 -c 'import sys, json, urllib.parse; print(urllib.parse.quote(json.load(sys.stdin)["nextCursor"], safe=""))')

  declare -g "results_${store}_healthz=$(MEASURE_LABEL=$store-healthz measure "$url/healthz")"
  [ "$store" = postgres ] && before=$(statements)
  declare -g "results_${store}_first=$(MEASURE_LABEL=$store-first-page measure -H "Authorization: Bearer $small" "$url/api/v1/history")"
  [ "$store" = postgres ] && first_statements=$(( $(statements) - before ))
  declare -g "results_${store}_deep=$(MEASURE_LABEL=$store-deep-cursor measure -H "Authorization: Bearer $big" "$url/api/v1/history?limit=50&cursor=$cursor")"
  declare -g "results_${store}_offset=$(MEASURE_LABEL=$store-offset measure -H "Authorization: Bearer $big" "$url/api/v1/history?limit=50&offset=5000")"
  [ "$store" = postgres ] && before=$(statements)
  declare -g "results_${store}_search=$(MEASURE_LABEL=$store-search measure -H "Authorization: Bearer $small" "$url/api/v1/history?q=unset")"
  [ "$store" = postgres ] && search_statements=$(( $(statements) - before ))
  # (Counting every match in 100,000 items per request: on PostgreSQL, 32 at once run past the 5 s
  # deadline, so its errors are reported rather than fatal.)
  declare -g "results_${store}_bigsearch=$(MEASURE_ALLOW_ERRORS=1 MEASURE_LABEL=$store-big-search measure -H "Authorization: Bearer $big" "$url/api/v1/history?q=storm%20%231")"
  kill "${started[@]}" 2>/dev/null || true
  wait "${started[@]}" 2>/dev/null || true
}

row() { read -r rps p50 p99 <<<"$2"; printf "%-44s %8s req/s  p50 %6s ms  p99 %6s ms\n" "$1" "$rps" "$p50" "$p99"; }
report() {
  local store=$1 healthz
  r() { local name="results_${store}_$1"; echo "${!name}"; }
  healthz=$(r healthz)
  echo "history of $ITEMS items on $store, wrk 32 connections, ${DURATION}s each, logs at warning:"
  row "gateway /healthz (baseline)" "$healthz"
  row "first page (a user with ~90 items)" "$(r first)"
  row "cursor page at 90,000 (user with $BIG_ITEMS)" "$(r deep)"
  row "offset page at 5,000 (user with $BIG_ITEMS)" "$(r offset)"
  row "search 'unset' (a user with ~90 items)" "$(r search)"
  row "search 'storm #1' (user with $BIG_ITEMS)" "$(r bigsearch)"
  ratio() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN { printf "%.2f", a/b }'; }
  echo "history/healthz throughput ratio$([ "$store" = postgres ] && echo " (postgres)"): first page $(ratio "$(r first)" "$healthz")  deep cursor page $(ratio "$(r deep)" "$healthz")  search $(ratio "$(r search)" "$healthz")"
}

if [ "${STORE:-sqlite}" = postgres ]; then
  # The same history on SQLite first (the baseline), then on a PostgreSQL of its own.
  start_bench_postgres
  bench_store sqlite
  bench_store postgres
  report sqlite
  echo
  report postgres
  # Statements per request, from pg_stat_statements: what the measurement ran over the requests
  # wrk made (its req/s times its seconds).
  per() { awk -v s="$1" -v r="${2%% *}" -v d="$DURATION" 'BEGIN { printf "%.2f", s / (r * d) }'; }
  echo "PostgreSQL statements per request: first page $(per "$first_statements" "$results_postgres_first")  search $(per "$search_statements" "$results_postgres_search")"
  ratio() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN { printf "%.2f", a/b }'; }
  echo "history-postgres/sqlite throughput ratio: first page $(ratio "$results_postgres_first" "$results_sqlite_first")  search $(ratio "$results_postgres_search" "$results_sqlite_search")  deep cursor page $(ratio "$results_postgres_deep" "$results_sqlite_deep")"
else
  bench_store sqlite
  report sqlite
fi
