#!/usr/bin/env bash
# Two builds side by side: the quota service's durable decisions and the jobs service's no-op
# jobs (2 workers), measured in turns (before, after, before, after, ...), so that the machine's
# drift falls on both alike. For a change that must not slow these down: build the revision
# before it and the one after for release, copy each's binaries to a folder of its own, then
#
#   scripts/bench-side-by-side.sh BEFORE_DIR AFTER_DIR
#
# (each folder holding quota, jobs, worker, quota-bench and jobs-bench; the clients of AFTER_DIR
# measure both, or each folder's own with OWN_CLIENTS=1, for a change of the bus's wire format). ROUNDS (default 3) turns each; BENCH_SECONDS (5) a quota run; BENCH_NOOP_JOBS
# (5000) a jobs run. Prints every run and the medians, and ends with
# `after/before: quota decisions X, jobs throughput Y`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 BEFORE_DIR AFTER_DIR" >&2; exit 2; }
BEFORE=$(cd "$1" && pwd)
AFTER=$(cd "$2" && pwd)
ROUNDS=${ROUNDS:-3}
SECONDS_EACH=${BENCH_SECONDS:-5}
NOOP_JOBS=${BENCH_NOOP_JOBS:-5000}
CALLERS=${BENCH_CALLERS:-64}
source scripts/bench-lib.sh
client_dir() { if [ "${OWN_CLIENTS:-0}" = 1 ]; then echo "$1"; else echo "$AFTER"; fi; }
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

quota_run() { # quota_run DIR: decisions/s of a fresh quota service of DIR
  local data endpoint pid out
  data=$(mktemp -d "$work/quota.XXXX")
  endpoint="tcp://127.0.0.1:$(port)"
  QUOTA_BIND=$endpoint DATA_DIR=$data LOG_LEVEL=warning QUOTA_MAX_IN_FLIGHT=4096 "$1/quota" >"$data/quota.log" 2>&1 & pid=$!
  sleep 1
  out=$("$(client_dir "$1")/quota-bench" "$endpoint" "$SECONDS_EACH" "$CALLERS")
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  field "$out" decisions_per_s
}

jobs_run() { # jobs_run DIR: jobs/s of no-op jobs through a fresh jobs service and 2 workers of DIR
  local data jobs_endpoint worker_endpoint jobs_pid workers=() out
  data=$(mktemp -d "$work/jobs.XXXX")
  jobs_endpoint="tcp://127.0.0.1:$(port)"
  worker_endpoint="tcp://127.0.0.1:$(port)"
  JOBS_BIND=$jobs_endpoint JOBS_WORKER_BIND=$worker_endpoint DATA_DIR=$data LOG_LEVEL=warning URL_SIGNING_SECRET=bench-secret \
    QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_MAX_IN_FLIGHT=4096 JOBS_MAX_QUEUED=1000000 \
    JOBS_EFFECTS='[{"id": "noop", "title": "No-op (benchmarks)", "processor": "noop"}]' "$1/jobs" >"$data/jobs.log" 2>&1 & jobs_pid=$!
  sleep 1
  for index in 1 2; do
    JOBS_WORKER_ENDPOINT=$worker_endpoint LOG_LEVEL=warning WORKER_ID="side-$index" WORKER_CAPACITY=8 "$1/worker" >"$data/worker-$index.log" 2>&1 & workers+=($!)
  done
  sleep 1.5
  out=$("$(client_dir "$1")/jobs-bench" "$jobs_endpoint" "$data/blobs" "$NOOP_JOBS" noop Tests/Fixtures/images/photo.jpg)
  kill "${workers[@]}" "$jobs_pid" 2>/dev/null; wait "${workers[@]}" "$jobs_pid" 2>/dev/null || true
  field "$out" jobs_per_s
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A quota jobs
for round in $(seq 1 "$ROUNDS"); do
  for side in before after; do
    dir=$BEFORE; [ "$side" = after ] && dir=$AFTER
    q=$(quota_run "$dir"); j=$(jobs_run "$dir")
    quota[$side]="${quota[$side]:-} $q"; jobs[$side]="${jobs[$side]:-} $j"
    echo "round $round $side: quota $q decisions/s, jobs $j jobs/s"
  done
done
qb=$(echo "${quota[before]}" | median); qa=$(echo "${quota[after]}" | median)
jb=$(echo "${jobs[before]}" | median); ja=$(echo "${jobs[after]}" | median)
echo "medians: quota before $qb, after $qa decisions/s; jobs before $jb, after $ja jobs/s"
awk -v qa="$qa" -v qb="$qb" -v ja="$ja" -v jb="$jb" 'BEGIN { printf "after/before: quota decisions %.3f, jobs throughput %.3f\n", qa / qb, ja / jb }'
