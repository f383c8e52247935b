#!/usr/bin/env bash
# Jobs benchmark, in one run on this machine:
# 1. the queue itself: jobs per second from creation to completed through the jobs service over
#    the bus with a `noop` effect (configured here only: no file work), two workers; against
#    Celery with Redis (a no-op task, two prefork workers, acks_late) and Huey with its SQLite
#    storage (a no-op task, two worker processes). Ends with
#    `jobs/celery throughput ratio: X  jobs/huey throughput ratio: Y`.
# 2. for the record: the `copy` effect (thumbnail included), two workers.
# 3. scale-out: a remote effect answered after 100 ms by a stand-in provider with a 64x48 image
#    (so that the queue, not libvips, is measured), 1, 2, 4, 8 and 16 worker processes, the
#    efficiency against linear and the CPU time each job costs the jobs service.
# BENCH_PERF=DIR records a perf profile of the whole machine during (1)'s no-op run (DIR/noop.data).
# STORE=postgres: instead, the no-op run on SQLite and on PostgreSQL (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
NOOP_JOBS=${BENCH_NOOP_JOBS:-5000}
COPY_JOBS=${BENCH_COPY_JOBS:-1000}
BASELINE_TASKS=${BENCH_BASELINE_TASKS:-2000}
PER_WORKER=${BENCH_JOBS_PER_WORKER:-40}
CAPACITY=${BENCH_WORKER_CAPACITY:-8}

sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
command -v redis-server >/dev/null || { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null; }
python3 -c "import celery, redis" 2>/dev/null || pip install -q celery redis
python3 -c "import huey" 2>/dev/null || pip install -q "huey==2.5.2"

source scripts/bench-lib.sh
build_release jobs worker jobs-bench gateway
image=Tests/Fixtures/images/photo.jpg
small=Tests/Fixtures/images/small.jpg

provider_port=$(port)
python3 Benchmarks/provider.py "$provider_port" "$small" 0.1 & pids+=($!)
jobs_endpoint="tcp://127.0.0.1:$(port)"
worker_endpoint="tcp://127.0.0.1:$(port)"
# Workers read inputs and write outputs through presigned URLs: with the folder store, the
# gateway's signed routes.
gateway_port=$(port)
GATEWAY_PORT=$gateway_port DATA_DIR=$work LOG_LEVEL=warning URL_SIGNING_SECRET=bench-secret "$BIN/gateway" & pids+=($!)
quota_endpoint="tcp://127.0.0.1:$(port)"
start_jobs() { # start_jobs [VARIABLE=VALUE...]: the jobs service, on SQLite unless told otherwise
  env JOBS_BIND=$jobs_endpoint URL_SIGNING_SECRET=bench-secret PUBLIC_BASE_URL="http://127.0.0.1:$gateway_port" JOBS_WORKER_BIND=$worker_endpoint \
    DATA_DIR=$work LOG_LEVEL=warning QUOTA_ENDPOINT=$quota_endpoint JOBS_MAX_IN_FLIGHT=4096 JOBS_MAX_QUEUED=1000000 \
    JOBS_EFFECTS="[{\"id\": \"remote-100ms\", \"processor\": \"remote\", \"endpoint\": \"http://127.0.0.1:$provider_port/infer\"},
                   {\"id\": \"noop\", \"title\": \"No-op (benchmarks)\", \"processor\": \"noop\"}]" \
    "$@" "$BIN/jobs" & jobs_pid=$!; pids+=($jobs_pid)
  sleep 1
}
start_jobs

workers=()
start_workers() { # start_workers COUNT [CAPACITY]
  for index in $(seq 1 "$1"); do
    JOBS_WORKER_ENDPOINT=$worker_endpoint LOG_LEVEL=warning WORKER_ID="bench-$index" \
      WORKER_CAPACITY="${2:-1}" "$BIN/worker" &
    workers+=($!)
  done
  sleep 1.5
}
stop_workers() { kill "${workers[@]}" 2>/dev/null || true; wait "${workers[@]}" 2>/dev/null || true; workers=(); sleep 3.5; }
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$jobs_pid/stat"; }

# STORE=postgres: the same no-op run on SQLite and then on PostgreSQL (a server of its own, with
# the statements it ran per job from pg_stat_statements); ends with
# `jobs-postgres/sqlite throughput ratio: X` (of the median rounds). BENCH_PERF=DIR also records
# a perf profile of the whole machine during each round (DIR/sqlite-N.data, DIR/postgres-N.data),
# and PostgreSQL's costliest statements (DIR/statements.txt).
if [ "${STORE:-sqlite}" = postgres ]; then
  # Each store runs ROUNDS times in a row on the same database (its tables grow from round to
  # round), and the median round is compared: a single round of a few seconds moved by a third
  # from one invocation to the next, on either store.
  ROUNDS=${BENCH_ROUNDS:-3}
  rounds() { # rounds LABEL: ROUNDS runs of jobs-bench; prints each round's jobs/s, then the median
    local index runs=()
    for index in $(seq 1 "$ROUNDS"); do
      runs+=("$(field "$(profiled "$1-$index" "$BIN/jobs-bench" "$jobs_endpoint" "$work/blobs" "$NOOP_JOBS" noop "$image")" jobs_per_s)")
    done
    echo "${runs[*]} $(printf '%s\n' "${runs[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')"
  }
  start_bench_postgres
  start_workers 2 "$CAPACITY"
  sqlite=$(rounds sqlite)
  stop_workers
  kill "$jobs_pid"; wait "$jobs_pid" 2>/dev/null || true
  start_jobs JOBS_DATABASE_URL="$POSTGRES_URL"
  start_workers 2 "$CAPACITY"
  before=$(statements)
  postgres=$(rounds postgres)
  after=$(statements)
  stop_workers
  top_statements statements.txt
  echo "jobs on SQLite (noop effect, 2 workers of capacity $CAPACITY, $ROUNDS rounds of $NOOP_JOBS jobs):     median ${sqlite##* } jobs/s (rounds: ${sqlite% *}; create to completed, over the bus)"
  echo "jobs on PostgreSQL (noop effect, 2 workers of capacity $CAPACITY, $ROUNDS rounds of $NOOP_JOBS jobs): median ${postgres##* } jobs/s (rounds: ${postgres% *})  $(awk -v s=$(( after - before )) -v n=$(( NOOP_JOBS * ROUNDS )) 'BEGIN { printf "%.2f", s / n }') statements/job (every replica's, relays and leases included)"
  awk -v p="${postgres##* }" -v q="${sqlite##* }" 'BEGIN { printf "jobs-postgres/sqlite throughput ratio: %.2f\n", p/q }'
  exit 0
fi

# 1. the queue itself: noop jobs, two workers
start_workers 2 "$CAPACITY"
noop=$(profiled noop "$BIN/jobs-bench" "$jobs_endpoint" "$work/blobs" "$NOOP_JOBS" noop "$image")
stop_workers

# Celery, same machine
redis_port=$(port)
redis-server --port "$redis_port" --save "" --appendonly no --loglevel warning & pids+=($!)
sleep 0.5
export CELERY_BROKER="redis://127.0.0.1:$redis_port/0"
(cd Benchmarks/celery && exec celery -A benchtasks worker --pool=prefork --concurrency=2 --loglevel=WARNING >/dev/null 2>&1) & celery_pid=$!; pids+=($celery_pid)
sleep 4
celery=$(cd Benchmarks/celery && python3 produce.py "$BASELINE_TASKS")
kill "$celery_pid" 2>/dev/null || true

# Huey with SQLite, same machine
export HUEY_DB="$work/huey.sqlite"
(cd Benchmarks/huey && exec huey_consumer benchtasks.huey -w 2 -k process -q >/dev/null 2>&1) & pids+=($!)
sleep 2
huey=$(cd Benchmarks/huey && python3 produce.py "$BASELINE_TASKS")

# 2. copy jobs, two workers, for the record
start_workers 2
copy=$("$BIN/jobs-bench" "$jobs_endpoint" "$work/blobs" "$COPY_JOBS" copy "$image")
stop_workers

echo "jobs service (noop effect, 2 workers of capacity $CAPACITY, $NOOP_JOBS jobs): $(field "$noop" jobs_per_s) jobs/s (create to completed, over the bus)"
echo "celery + redis (no-op task, 2 prefork workers, acks_late, $BASELINE_TASKS tasks): $(field "$celery" celery_tasks_per_s) tasks/s"
echo "huey + sqlite (no-op task, 2 worker processes, $BASELINE_TASKS tasks): $(field "$huey" huey_tasks_per_s) tasks/s"
echo "jobs service (copy effect with thumbnail, 2 workers, $COPY_JOBS jobs): $(field "$copy" jobs_per_s) jobs/s"

# 3. scale-out with a 100 ms remote effect on a small image
echo
printf "%-8s %12s %12s %18s\n" workers "jobs/s" efficiency "jobs CPU ms/job"
base=""
hz=$(getconf CLK_TCK)
for count in 1 2 4 8 16; do
  start_workers "$count"
  before=$(cpu_ticks)
  jobs=$(( PER_WORKER * count ))
  line=$("$BIN/jobs-bench" "$jobs_endpoint" "$work/blobs" "$jobs" remote-100ms "$image")
  after=$(cpu_ticks)
  stop_workers
  rate=$(field "$line" jobs_per_s)
  [ -z "$base" ] && base=$rate
  awk -v w="$count" -v r="$rate" -v b="$base" -v t=$(( after - before )) -v hz="$hz" -v n="$jobs" \
    'BEGIN { printf "%-8d %12.1f %12.2f %18.3f\n", w, r, r / (w * b), t * 1000 / hz / n }'
done
echo
awk -v j="$(field "$noop" jobs_per_s)" -v c="$(field "$celery" celery_tasks_per_s)" -v h="$(field "$huey" huey_tasks_per_s)" \
  'BEGIN { printf "jobs/celery throughput ratio: %.2f  jobs/huey throughput ratio: %.2f\n", j/c, j/h }'
