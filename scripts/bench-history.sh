#!/usr/bin/env bash
# History benchmark: a history database of $ITEMS items (default 1,000,000) for $USERS users
# (10,000), one of whom has $BIG_ITEMS (100,000); quota, history, jobs and the gateway built for
# release; wrk at 32 connections against the gateway's /healthz (the baseline) and, through the
# gateway, a typical user's first page, a cursor page deep in the large history, an offset page
# at 5,000, and substring searches (a short history; the large one for a common phrase and for
# a phrase of one item), all in the same run. STORE=postgres: the same history in a
# PostgreSQL of its own too, a second stack on it running beside the SQLite one, and the ratio of
# the two (`history-postgres/sqlite throughput ratio: ...`) with PostgreSQL's statements per
# request. The two stacks are measured in turns, route by route, $BENCH_ROUNDS times (3, each
# $BENCH_SECONDS, 5 s), and each figure is the median of its turns: this machine's speed drifts
# by a third within minutes, which a run of one store after the other measured as a difference
# of the stores.
# BENCH_PERF=DIR also records a perf profile of the whole machine during each measurement;
# BENCH_ROUTES measures only some routes (of: healthz first deep offset search bigsearch raresearch).
set -euo pipefail
cd "$(dirname "$0")/.."
ITEMS=${ITEMS:-1000000}
USERS=${USERS:-10000}
BIG_ITEMS=${BIG_ITEMS:-100000}
# The deep cursor page's position: nine tenths into the large history (90,000 by default).
DEEP=$((BIG_ITEMS * 9 / 10))
ROUTES=${BENCH_ROUTES:-healthz first deep offset search bigsearch raresearch}
source scripts/bench-lib.sh
need wrk wrk
build_release quota history jobs gateway history-bench

# Fills history on $1 (sqlite or postgres) and starts quota, history, jobs and the gateway on it;
# sets url_$1 and cursor_$1 (the deep page's: a cursor is signed by its store), and the tokens.
start_store() {
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
  for name in quota history jobs gateway; do "$BIN/$name" & pids+=($!); done
  url="http://127.0.0.1:$GATEWAY_PORT"
  for _ in $(seq 1 100); do curl -fsS "$url/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
  declare -g "url_$store=$url"
  small=$("$BIN/history-bench" token "$JWT_SECRET" user-00042)
  big=$("$BIN/history-bench" token "$JWT_SECRET" user-big)
  declare -g "cursor_$store=$(curl -fsS -H "Authorization: Bearer $big" "$url/api/v1/history?limit=50&offset=$DEEP" |
    python3 -c 'import sys, json, urllib.parse; print(urllib.parse.quote(json.load(sys.stdin)["nextCursor"], safe=""))')"
}

# The wrk arguments of route $1 on store $2, '|' between them (the path after the gateway's URL last).
route_arguments() {
  local cursor="cursor_$2"
  case $1 in
    healthz) echo "/healthz" ;;
    first) echo "-H|Authorization: Bearer $small|/api/v1/history" ;;
    deep) echo "-H|Authorization: Bearer $big|/api/v1/history?limit=50&cursor=${!cursor}" ;;
    offset) echo "-H|Authorization: Bearer $big|/api/v1/history?limit=50&offset=5000" ;;
    search) echo "-H|Authorization: Bearer $small|/api/v1/history?q=unset" ;;
    bigsearch) echo "-H|Authorization: Bearer $big|/api/v1/history?q=storm%20%231" ;;
    raresearch) echo "-H|Authorization: Bearer $big|/api/v1/history?q=%2377777" ;;
  esac
}

# Measures route $1 on each store in $STORES, in turns, $ROUNDS times; sets results_STORE_ROUTE to
# the medians ("req/s p50 p99"), and for PostgreSQL statements_ROUTE to its statements per request.
measure_route() {
  local route=$1 store round args url runs before requests
  for store in $STORES; do declare -g "runs_$store="; done
  local total_statements=0 total_requests=0
  for round in $(seq 1 "$ROUNDS"); do
    for store in $STORES; do
      url="url_$store"
      IFS='|' read -r -a args <<<"$(route_arguments "$route" "$store")"
      local path=${args[-1]}; unset 'args[-1]'
      [ "$store" = postgres ] && before=$(statements)
      # (Counting every match in 100,000 items per request: on PostgreSQL, 32 at once can run past
      # the 5 s deadline, so that route's errors are reported rather than fatal.)
      runs=$(MEASURE_ALLOW_ERRORS=$([ "$route" = bigsearch ] && echo 1) MEASURE_LABEL=$store-$route-$round \
        measure ${args[@]+"${args[@]}"} "${!url}$path")
      if [ "$store" = postgres ]; then
        total_statements=$(( total_statements + $(statements) - before ))
        total_requests=$(awk -v t="$total_requests" -v r="${runs%% *}" -v d="$DURATION" 'BEGIN { printf "%d", t + r * d }')
      fi
      declare -g "runs_$store=$(eval echo "\$runs_$store")$runs;"
    done
  done
  for store in $STORES; do
    declare -g "results_${store}_$route=$(eval echo "\$runs_$store" | python3 -c '
import statistics, sys
runs = [list(map(float, r.split())) for r in sys.stdin.read().strip().strip(";").split(";")]
print("%.0f %.2f %.2f" % tuple(statistics.median(column) for column in zip(*runs)))')"
  done
  [ "$total_requests" -gt 0 ] && declare -g "statements_$route=$(awk -v s="$total_statements" -v r="$total_requests" 'BEGIN { printf "%.2f", s / r }')"
  return 0
}

# The throughput of measurement $1 over that of $2 ("req/s p50 p99" each); "-" without either.
ratio() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN { if (a == "" || b + 0 == 0) printf "-"; else printf "%.2f", a/b }'; }
row() { read -r rps p50 p99 <<<"$2"; printf "%-44s %8s req/s  p50 %6s ms  p99 %6s ms\n" "$1" "$rps" "$p50" "$p99"; }
report() {
  local store=$1 healthz
  r() { local name="results_${store}_$1"; echo "${!name:-}"; }
  healthz=$(r healthz)
  echo "history of $ITEMS items on $store, wrk 32 connections, median of $ROUNDS turns of ${DURATION}s, logs at warning:"
  row "gateway /healthz (baseline)" "$healthz"
  row "first page (a user with ~90 items)" "$(r first)"
  row "cursor page at $DEEP (user with $BIG_ITEMS)" "$(r deep)"
  row "offset page at 5,000 (user with $BIG_ITEMS)" "$(r offset)"
  row "search 'unset' (a user with ~90 items)" "$(r search)"
  row "search 'storm #1' (user with $BIG_ITEMS)" "$(r bigsearch)"
  row "search '#77777', one item (user with $BIG_ITEMS)" "$(r raresearch)"
  echo "history/healthz throughput ratio$([ "$store" = postgres ] && echo " (postgres)"): first page $(ratio "$(r first)" "$healthz")  deep cursor page $(ratio "$(r deep)" "$healthz")  search $(ratio "$(r search)" "$healthz")"
}

if [ "${STORE:-sqlite}" = postgres ]; then
  # The same history on SQLite (the baseline) and on a PostgreSQL of its own, both stacks up,
  # measured in turns.
  STORES="sqlite postgres" ROUNDS=${BENCH_ROUNDS:-3} DURATION=${BENCH_SECONDS:-5}
  start_bench_postgres
  start_store sqlite
  start_store postgres
  for route in $ROUTES; do measure_route "$route"; done
  report sqlite
  echo
  report postgres
  echo "PostgreSQL statements per request: first page ${statements_first:--}  search ${statements_search:--}"
  echo "history-postgres/sqlite throughput ratio: first page $(ratio "${results_postgres_first:-}" "${results_sqlite_first:-}")  search $(ratio "${results_postgres_search:-}" "${results_sqlite_search:-}")  deep cursor page $(ratio "${results_postgres_deep:-}" "${results_sqlite_deep:-}")"
else
  STORES=sqlite ROUNDS=${BENCH_ROUNDS:-1} DURATION=${BENCH_SECONDS:-10}
  start_store sqlite
  for route in $ROUTES; do measure_route "$route"; done
  report sqlite
fi
