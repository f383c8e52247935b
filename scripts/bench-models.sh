#!/usr/bin/env bash
# Model benchmark, in one run on this machine, release build: the whole system (quota, history,
# jobs, the gateway, 2 workers of capacity 8) against the provider fixture, whose images take
# 50 ms and whose videos take 5 s at fal's queue. First the fixture alone, asked for images 16 at
# once (the providers' ceiling: what 2 workers x 8 slots could get at best); then
# $BENCH_MODEL_IMAGES (1,000) image jobs through the gateway; then $BENCH_MODEL_VIDEOS (1,000)
# video jobs created at once, counting the generations in flight at the provider and the worker
# slots held meanwhile. Ends with
# `models: images X jobs/s (Y of the providers' ceiling)  videos in flight Z, worker slots held W`.
# BENCH_PERF=DIR also records a perf profile of the whole machine during the image jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=${BENCH_MODEL_IMAGES:-1000}
VIDEOS=${BENCH_MODEL_VIDEOS:-1000}
CAPACITY=${BENCH_WORKER_CAPACITY:-8}

source scripts/bench-lib.sh
build_release quota history jobs worker gateway provider-fixture

fixture_port=$(port)
FIXTURE_PORT=$fixture_port FIXTURE_IMAGE_MS=50 FIXTURE_VIDEO_MS=5000 "$BIN/provider-fixture" > "$work/fixture.log" 2>&1 & pids+=($!)
fixture="http://127.0.0.1:$fixture_port"
gateway_port=$(port)
export DATA_DIR=$work LOG_LEVEL=warning URL_SIGNING_SECRET=bench-secret PUBLIC_BASE_URL="http://127.0.0.1:$gateway_port"
export QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" HISTORY_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_ENDPOINT="tcp://127.0.0.1:$(port)"
worker_endpoint="tcp://127.0.0.1:$(port)"
QUOTA_BIND=$QUOTA_ENDPOINT QUOTA_PLANS='{"free": {"daily": 1000000, "monthly": 10000000}}' "$BIN/quota" > "$work/quota.log" 2>&1 & pids+=($!)
HISTORY_BIND=$HISTORY_ENDPOINT "$BIN/history" > "$work/history.log" 2>&1 & pids+=($!)
JOBS_BIND=$JOBS_ENDPOINT JOBS_WORKER_BIND=$worker_endpoint JOBS_MAX_QUEUED=1000000 \
  JOBS_EFFECTS="[{\"id\": \"banana\", \"processor\": \"gemini\", \"model\": \"gemini-2.5-flash-image\", \"endpoint\": \"$fixture\"},
                 {\"id\": \"veo\", \"processor\": \"fal\", \"model\": \"fal-ai/veo3.1/image-to-video\", \"kind\": \"video\", \"credits\": 4, \"endpoint\": \"$fixture\"}]" \
  "$BIN/jobs" > "$work/jobs.log" 2>&1 & pids+=($!)
GATEWAY_PORT=$gateway_port FAL_WEBHOOK_JWKS_URL="$fixture/.well-known/jwks.json" "$BIN/gateway" > "$work/gateway.log" 2>&1 & pids+=($!)
for index in 1 2; do
  JOBS_WORKER_ENDPOINT=$worker_endpoint WORKER_ID="bench-$index" WORKER_CAPACITY=$CAPACITY \
    GEMINI_API_KEY=test-gemini-key FAL_KEY=test-fal-key "$BIN/worker" > "$work/worker-$index.log" 2>&1 & pids+=($!)
done
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$gateway_port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
for _ in $(seq 1 100); do curl -fsS "$fixture/_fixture/stats" >/dev/null 2>&1 && break; sleep 0.2; done
sleep 1.5  # the workers' `ready`

line=$(python3 Benchmarks/models-bench.py "http://127.0.0.1:$gateway_port" "$fixture" "$IMAGES" "$VIDEOS" 16)
field() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
echo "provider fixture alone, 16 at once:  $(field ceiling) images/s"
echo "through the system ($IMAGES image jobs, 2 workers x $CAPACITY): $(field images_per_s) jobs/s"
echo "$VIDEOS video jobs of 5 s: $(field videos_in_flight) in flight at the provider at once, $(field slots_held) worker slots held then"
python3 -c "import sys; c, x = float(sys.argv[1]), float(sys.argv[2]); print('models: images %.1f jobs/s (%.2f of the providers\\' ceiling)  videos in flight %s, worker slots held %s' % (x, x / c, sys.argv[3], sys.argv[4]))" \
  "$(field ceiling)" "$(field images_per_s)" "$(field videos_in_flight)" "$(field slots_held)"
