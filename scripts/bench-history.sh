#!/usr/bin/env bash
# History benchmark: a history database of $ITEMS items (default 1,000,000) for $USERS users
# (10,000), one of whom has $BIG_ITEMS (100,000); quota, history, jobs and the gateway built for
# release; wrk at 32 connections against the gateway's /healthz (the baseline) and, through the
# gateway, a typical user's first page, a cursor page deep in the large history, an offset page
# at 5,000, and a substring search, all in the same run. STORE=postgres: the same history in a
# PostgreSQL of its own (scripts/postgres-server.sh, in the scratch folder), history on it.
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

echo "filling a history of $ITEMS items ($USERS users, one with $BIG_ITEMS; store: ${STORE:-sqlite})..."
if [ "${STORE:-sqlite}" = postgres ]; then
  # PostgreSQL runs as its own user, which must reach its folder.
  chmod 755 "$work"
  scripts/postgres-server.sh install
  scripts/postgres-server.sh start "$work/postgres" "$(port)" >/dev/null
  source "$work/postgres/postgres.env"
  cleanup_postgres() { scripts/postgres-server.sh stop "$work/postgres" >/dev/null 2>&1 || true; }
  trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; cleanup_postgres; cleanup' EXIT
  export HISTORY_DATABASE_URL=$POSTGRES_URL
  "$BIN/history-bench" fill-postgres "$POSTGRES_URL" "$USERS" "$ITEMS" "$BIG_ITEMS" | tail -1
else
  "$BIN/history-bench" fill "$work/history.sqlite" "$USERS" "$ITEMS" "$BIG_ITEMS" | tail -1
fi

export DATA_DIR=$work LOG_LEVEL=warning
export QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" HISTORY_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_ENDPOINT="tcp://127.0.0.1:$(port)"
export QUOTA_BIND=$QUOTA_ENDPOINT HISTORY_BIND=$HISTORY_ENDPOINT JOBS_BIND=$JOBS_ENDPOINT JOBS_WORKER_BIND="tcp://127.0.0.1:$(port)"
export GATEWAY_PORT=$(port) JWT_SECRET="bench-history-jwt-secret-0123456789abcdef" ADMIN_TOKEN=bench
for name in quota history jobs gateway; do "$BIN/$name" & pids+=($!); done
url="http://127.0.0.1:$GATEWAY_PORT"
for _ in $(seq 1 100); do curl -fsS "$url/readyz" >/dev/null 2>&1 && break; sleep 0.2; done

small=$("$BIN/history-bench" token "$JWT_SECRET" user-00042)
big=$("$BIN/history-bench" token "$JWT_SECRET" user-big)
cursor=$(curl -fsS -H "Authorization: Bearer $big" "$url/api/v1/history?limit=50&offset=90000" |
  python3 -c 'import sys, json, urllib.parse; print(urllib.parse.quote(json.load(sys.stdin)["nextCursor"], safe=""))')

healthz=$(MEASURE_LABEL=healthz measure "$url/healthz")
first=$(MEASURE_LABEL=first-page measure -H "Authorization: Bearer $small" "$url/api/v1/history")
deep=$(MEASURE_LABEL=deep-cursor measure -H "Authorization: Bearer $big" "$url/api/v1/history?limit=50&cursor=$cursor")
offset=$(MEASURE_LABEL=offset measure -H "Authorization: Bearer $big" "$url/api/v1/history?limit=50&offset=5000")
search=$(MEASURE_LABEL=search measure -H "Authorization: Bearer $small" "$url/api/v1/history?q=unset")
# (Counting every match in 100,000 items per request: on PostgreSQL, 32 at once run past the 5 s
# deadline, so its errors are reported rather than fatal.)
bigsearch=$(MEASURE_ALLOW_ERRORS=1 MEASURE_LABEL=big-search measure -H "Authorization: Bearer $big" "$url/api/v1/history?q=storm%20%231")

row() { read -r rps p50 p99 <<<"$2"; printf "%-44s %8s req/s  p50 %6s ms  p99 %6s ms\n" "$1" "$rps" "$p50" "$p99"; }
echo "history of $ITEMS items on ${STORE:-sqlite}, wrk 32 connections, ${DURATION}s each, logs at warning:"
row "gateway /healthz (baseline)" "$healthz"
row "first page (a user with ~90 items)" "$first"
row "cursor page at 90,000 (user with $BIG_ITEMS)" "$deep"
row "offset page at 5,000 (user with $BIG_ITEMS)" "$offset"
row "search 'unset' (a user with ~90 items)" "$search"
row "search 'storm #1' (user with $BIG_ITEMS)" "$bigsearch"
ratio() { awk -v a="${1%% *}" -v b="${healthz%% *}" 'BEGIN { printf "%.2f", a/b }'; }
echo "history/healthz throughput ratio: first page $(ratio "$first")  deep cursor page $(ratio "$deep")  search $(ratio "$search")"
