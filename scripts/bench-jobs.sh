#!/usr/bin/env bash
# Jobs benchmark, in one run on this machine:
# 1. jobs per second from creation to completed through the jobs service over the bus, `copy`
#    effect, two workers; against Celery with Redis (a no-op task, two prefork workers, acks_late).
# 2. scale-out: a remote effect answered after 100 ms by a stand-in provider, with 1, 2, 4, 8 and
#    16 worker processes, and the efficiency against linear.
set -euo pipefail
cd "$(dirname "$0")/.."
COPY_JOBS=${BENCH_COPY_JOBS:-1000}
CELERY_TASKS=${BENCH_CELERY_TASKS:-2000}
PER_WORKER=${BENCH_JOBS_PER_WORKER:-40}

sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
command -v redis-server >/dev/null || { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null; }
python3 -c "import celery, redis" 2>/dev/null || pip install -q celery redis

source scripts/bench-lib.sh
build_release jobs worker jobs-bench
image=Tests/Fixtures/images/photo.jpg

provider_port=$(port)
python3 Benchmarks/provider.py "$provider_port" "$image" 0.1 & pids+=($!)
jobs_endpoint="tcp://127.0.0.1:$(port)"
worker_endpoint="tcp://127.0.0.1:$(port)"
JOBS_BIND=$jobs_endpoint JOBS_WORKER_BIND=$worker_endpoint DATA_DIR=$work LOG_LEVEL=warning \
  QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_MAX_IN_FLIGHT=4096 \
  JOBS_EFFECTS="[{\"id\": \"remote-100ms\", \"processor\": \"remote\", \"endpoint\": \"http://127.0.0.1:$provider_port/infer\"}]" \
  "$BIN/jobs" & pids+=($!)
sleep 1

workers=()
start_workers() {
  for index in $(seq 1 "$1"); do
    JOBS_WORKER_ENDPOINT=$worker_endpoint BLOB_DIR=$work/blobs LOG_LEVEL=warning WORKER_ID="bench-$index" "$BIN/worker" &
    workers+=($!)
  done
  sleep 1.5
}
stop_workers() { kill "${workers[@]}" 2>/dev/null || true; wait "${workers[@]}" 2>/dev/null || true; workers=(); sleep 3.5; }
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# 1. copy jobs, two workers
start_workers 2
copy=$("$BIN/jobs-bench" "$jobs_endpoint" "$work/blobs" "$COPY_JOBS" copy "$image")
stop_workers

# Celery, same machine
redis_port=$(port)
redis-server --port "$redis_port" --save "" --appendonly no --loglevel warning & pids+=($!)
sleep 0.5
export CELERY_BROKER="redis://127.0.0.1:$redis_port/0"
(cd Benchmarks/celery && exec celery -A benchtasks worker --pool=prefork --concurrency=2 --loglevel=WARNING >/dev/null 2>&1) & pids+=($!)
sleep 4
celery=$(cd Benchmarks/celery && python3 produce.py "$CELERY_TASKS")

echo "jobs service (copy effect, 2 workers, $COPY_JOBS jobs): $(field "$copy" jobs_per_s) jobs/s (create to completed, thumbnail included)"
echo "celery + redis (no-op task, 2 prefork workers, acks_late, $CELERY_TASKS tasks): $(field "$celery" celery_tasks_per_s) tasks/s"
awk -v j="$(field "$copy" jobs_per_s)" -v c="$(field "$celery" celery_tasks_per_s)" 'BEGIN { printf "jobs/celery throughput ratio: %.2f\n", j/c }'

# 2. scale-out with a 100 ms remote effect
echo
printf "%-8s %12s %12s\n" workers "jobs/s" efficiency
base=""
for count in 1 2 4 8 16; do
  start_workers "$count"
  line=$("$BIN/jobs-bench" "$jobs_endpoint" "$work/blobs" $(( PER_WORKER * count )) remote-100ms "$image")
  stop_workers
  rate=$(field "$line" jobs_per_s)
  [ -z "$base" ] && base=$rate
  awk -v w="$count" -v r="$rate" -v b="$base" 'BEGIN { printf "%-8d %12.1f %12.2f\n", w, r, r / (w * b) }'
done
