#!/usr/bin/env bash
# Gateway benchmark: in one run, built for release, wrk (installed if missing) at 32 connections
# for $BENCH_SECONDS (10) each against a bare Hummingbird route (bench-bare, the baseline), then
# the gateway's /healthz, GET /api/v1/users/me and POST /api/v1/jobs (a plan with room for the
# whole run, no workers, so jobs only queue), all with logs at warning; then /healthz and the
# bare route again with `make run`'s default logging (info, to a file), and /healthz and users/me
# with the gateway's tasks on its event loops (GATEWAY_TASKS_ON_EVENT_LOOPS=true). Prints req/s, p50 and p99
# of each and the line `gateway/bare throughput ratio: healthz A  users/me B  jobs C`; and, for
# POST /api/v1/jobs, the CPU time (user + system, from /proc) each process spent per job created,
# counted from before the run until every outbox entry it made is delivered:
# `POST jobs CPU per job: gateway A µs, quota B µs, jobs C µs, history D µs, total E µs`; and the
# same for users/me (gateway and quota) and the bare route, per request.
# BENCH_PERF=DIR also records a perf profile of the whole machine during each measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_SECONDS:-10}

source scripts/bench-lib.sh
need wrk wrk
build_release quota history jobs gateway bench-bare history-bench

export DATA_DIR=$work LOG_LEVEL=warning
export QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" HISTORY_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_ENDPOINT="tcp://127.0.0.1:$(port)"
export QUOTA_BIND=$QUOTA_ENDPOINT HISTORY_BIND=$HISTORY_ENDPOINT JOBS_BIND=$JOBS_ENDPOINT JOBS_WORKER_BIND="tcp://127.0.0.1:$(port)"
export JWT_SECRET="bench-gateway-jwt-secret-0123456789abcdef" ADMIN_TOKEN=bench URL_SIGNING_SECRET=bench-signing
export QUOTA_PLANS='{"free": {"daily": 20, "monthly": 600, "retentionDays": 30}, "pro": {"daily": 500, "isPro": true, "retentionDays": 365}, "bench": {"daily": 100000000, "monthly": 100000000, "retentionDays": 30}}'
export JOBS_MAX_QUEUED=10000000
GATEWAY_PORT=$(port); BARE_PORT=$(port)
export GATEWAY_PORT PUBLIC_BASE_URL="http://127.0.0.1:$GATEWAY_PORT"
declare -A service_pid
for name in quota history jobs; do "$BIN/$name" > "$work/$name.log" 2>&1 & pids+=($!); service_pid[$name]=$!; done
start_gateway() {
  "$BIN/gateway" > "$work/gateway.log" 2>&1 & gateway=$!; pids+=($gateway)
  for _ in $(seq 1 100); do curl -fsS "$url/readyz" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "the gateway did not become ready" >&2; exit 1
}
start_bare() {
  "$BIN/bench-bare" "$BARE_PORT" > "$work/bare.log" 2>&1 & bare=$!; pids+=($bare)
  for _ in $(seq 1 100); do curl -fsS "$bare_url/healthz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "bench-bare did not start" >&2; exit 1
}
url="http://127.0.0.1:$GATEWAY_PORT"; bare_url="http://127.0.0.1:$BARE_PORT"
start_gateway; start_bare

user=bench-user
token=$("$BIN/history-bench" token "$JWT_SECRET" "$user")
curl -fsS -X PUT -H "Authorization: Bearer $ADMIN_TOKEN" -H "Content-Type: application/json" -d '{"plan": "bench"}' "$url/admin/v1/users/$user/plan" >/dev/null
upload=$(curl -fsS -X POST -H "Authorization: Bearer $token" -H "Content-Type: application/json" \
  -d '{"filename": "photo.jpg", "contentType": "image/jpeg"}' "$url/api/v1/uploads/presigned")
upload_url=$(echo "$upload" | python3 -c 'import sys, json; print(json.load(sys.stdin)["uploadUrl"])')
image_key=$(echo "$upload" | python3 -c 'import sys, json; print(json.load(sys.stdin)["imageKey"])')
curl -fsS -X PUT -H "Content-Type: image/jpeg" --data-binary @Tests/Fixtures/images/photo.jpg "$upload_url" >/dev/null
cat > "$work/create.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"imageKey": "$image_key", "effectId": "copy", "parameters": {}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
LUA

# CPU ticks (user + system) of a process so far.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# µs of CPU per item from a tick count and a count of items.
per_item() { awk -v t="$1" -v hz="$(getconf CLK_TCK)" -v n="$2" 'BEGIN { printf "%.0f", t * 1e6 / hz / n }'; }
# µs of CPU per request from a tick count and a measure's result (req/s over DURATION seconds).
per_request() { per_item "$1" "$(awk -v rps="${2%% *}" -v d="$DURATION" 'BEGIN { print rps * d }')"; }
bare_pid=$bare; bare_ticks=$(ticks "$bare_pid")
bare=$(MEASURE_LABEL=bare measure "$bare_url/healthz")
bare_ticks=$(( $(ticks "$bare_pid") - bare_ticks ))
healthz=$(MEASURE_LABEL=healthz measure "$url/healthz")
me_ticks=$(ticks "$gateway"); me_quota_ticks=$(ticks "${service_pid[quota]}")
me=$(MEASURE_LABEL=users-me measure -H "Authorization: Bearer $token" "$url/api/v1/users/me")
me_ticks=$(( $(ticks "$gateway") - me_ticks )); me_quota_ticks=$(( $(ticks "${service_pid[quota]}") - me_quota_ticks ))
metric_sum() { curl -fsS "$url/metrics" | awk -v name="$1" '$1 == name || index($1, name "{") == 1 { sum += $NF } END { printf "%d", sum }'; }
service_pid[gateway]=$gateway
declare -A cpu_before
for name in gateway quota jobs history; do cpu_before[$name]=$(ticks "${service_pid[$name]}"); done
queued_before=$(metric_sum jobs_queue_length)
jobs=$(MEASURE_LABEL=jobs measure -s "$work/create.lua" "$url/api/v1/jobs")
# Until the outboxes have delivered what the creations made (history's items, for one).
drained=""
for _ in $(seq 1 600); do [ "$(metric_sum jobs_outbox_backlog)" = 0 ] && { drained=1; break; }; sleep 0.1; done
# A backlog left after a minute: the CPU per job below misses what delivering it costs.
[ -n "$drained" ] || echo "warning: the jobs outbox still held $(metric_sum jobs_outbox_backlog) entries after 60 s; CPU per job is low" >&2
created=$(( $(metric_sum jobs_queue_length) - queued_before ))
cpu_line="POST jobs CPU per job:"
cpu_total=0
for name in gateway quota jobs history; do
  spent=$(( $(ticks "${service_pid[$name]}") - ${cpu_before[$name]} ))
  cpu_total=$(( cpu_total + spent ))
  cpu_line+=" $name $(per_item "$spent" "$created") µs,"
done
cpu_line+=" total $(per_item "$cpu_total" "$created") µs"

# The same gateway with its tasks on its event loops instead of Swift's pool (bus calls then go
# out and come back on the loop that serves the request, EventLoopLane): measured in the same run.
kill "$gateway"; wait "$gateway" 2>/dev/null || true
GATEWAY_TASKS_ON_EVENT_LOOPS=true start_gateway
healthz_loops=$(MEASURE_LABEL=healthz-loops measure "$url/healthz")
me_loops=$(MEASURE_LABEL=users-me-loops measure -H "Authorization: Bearer $token" "$url/api/v1/users/me")

# make run's default logging: info, each process writing its lines (to a file here).
kill "$gateway"; wait "$gateway" 2>/dev/null || true
LOG_LEVEL=info start_gateway
healthz_info=$(MEASURE_LABEL=healthz-info measure "$url/healthz")
info_lines=$(wc -l < "$work/gateway.log")

row() { read -r rps p50 p99 <<<"$2"; printf "%-48s %8s req/s  p50 %6s ms  p99 %6s ms\n" "$1" "$rps" "$p50" "$p99"; }
echo "wrk 32 connections, ${DURATION}s each, release build:"
row "bare Hummingbird route (baseline)" "$bare"
row "gateway /healthz, logs at warning" "$healthz"
row "gateway GET /api/v1/users/me" "$me"
row "gateway POST /api/v1/jobs (durable reserve + create)" "$jobs"
row "gateway /healthz, tasks on the event loops" "$healthz_loops"
row "gateway GET /api/v1/users/me, tasks on the event loops" "$me_loops"
row "gateway /healthz, logs at info ($info_lines lines)" "$healthz_info"
ratio() { awk -v a="${1%% *}" -v b="${bare%% *}" 'BEGIN { printf "%.2f", a/b }'; }
echo "gateway/bare throughput ratio (logs at info): healthz $(ratio "$healthz_info")"
echo "gateway/bare throughput ratio (tasks on the event loops): healthz $(ratio "$healthz_loops")  users/me $(ratio "$me_loops")"
echo "POST jobs created: $created (CPU counted until the outboxes were empty)"
echo "$cpu_line"
echo "users/me CPU per request: gateway $(per_request "$me_ticks" "$me") µs, quota $(per_request "$me_quota_ticks" "$me") µs (the bare route: $(per_request "$bare_ticks" "$bare") µs)"
echo "gateway/bare throughput ratio: healthz $(ratio "$healthz")  users/me $(ratio "$me")  jobs $(ratio "$jobs")"
