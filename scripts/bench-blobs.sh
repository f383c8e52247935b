#!/usr/bin/env bash
# Blob benchmark, in one run on this machine, release build: $BENCH_UPLOADS (2,000) uploads of
# 2 MB through the app's flow (presign at the gateway, then the PUT where the answer says), 16 at
# once, first with the folder store (the PUT goes to the gateway, which checks and stores it),
# then with the S3 store (a local RADOS Gateway: the PUT goes to the bucket). Prints uploads per
# second, the gateway's CPU time per upload and the bytes that crossed the gateway per upload of
# each, and ends with
# `blobs: s3 X uploads/s, gateway Y ms CPU and Z bytes per upload; folder X uploads/s, gateway Y ms CPU and Z bytes per upload`.
set -euo pipefail
cd "$(dirname "$0")/.."
UPLOADS=${BENCH_UPLOADS:-2000}
CONCURRENCY=${BENCH_CONCURRENCY:-16}

source scripts/bench-lib.sh
scripts/s3-server.sh install
build_release quota gateway

export DATA_DIR=$work LOG_LEVEL=warning URL_SIGNING_SECRET=bench-signing
export QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" HISTORY_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_ENDPOINT="tcp://127.0.0.1:$(port)"
export QUOTA_BIND=$QUOTA_ENDPOINT
"$BIN/quota" > "$work/quota.log" 2>&1 & pids+=($!)

s3_port=$(scripts/free-port-pair.py)
# 2,000 uploads of 2 MB are 4 GB, held in the memstore OSD's memory: room for them.
S3_MEMORY_GB=${S3_MEMORY_GB:-8} scripts/s3-server.sh start "$work/s3" "$s3_port" >/dev/null
trap 'scripts/s3-server.sh stop "$work/s3" >/dev/null 2>&1 || true; cleanup' EXIT

run() {  # run STORE: the benchmark's line against a gateway on STORE
  local port gateway line
  port=$(port)
  (
    export GATEWAY_PORT=$port PUBLIC_BASE_URL="http://127.0.0.1:$port"
    if [ "$1" = s3 ]; then source "$work/s3/s3.env"; else export BLOB_STORE=folder BLOB_DIR="$work/blobs"; fi
    exec "$BIN/gateway"
  ) > "$work/gateway-$1.log" 2>&1 &
  gateway=$!; pids+=($gateway)
  for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  line=$(python3 Benchmarks/blobs-bench.py "http://127.0.0.1:$port" "$gateway" "$UPLOADS" "$CONCURRENCY")
  kill "$gateway"; wait "$gateway" 2>/dev/null || true
  echo "$line"
}
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

folder=$(run folder)
echo "folder store ($UPLOADS uploads of 2 MB, $CONCURRENCY at once): $folder"
s3=$(run s3)
echo "S3 store (RADOS Gateway):                        $s3"
printf 'blobs: s3 %s uploads/s, gateway %s ms CPU and %s bytes per upload; folder %s uploads/s, gateway %s ms CPU and %s bytes per upload\n' \
  "$(field "$s3" uploads_per_s)" "$(field "$s3" gateway_cpu_ms)" "$(field "$s3" gateway_bytes)" \
  "$(field "$folder" uploads_per_s)" "$(field "$folder" gateway_cpu_ms)" "$(field "$folder" gateway_bytes)"
