#!/usr/bin/env bash
# The standing check `make test` ends with: a stack of its own (`scripts/run.sh` on a temporary
# data folder, a free port, ipc:// bus endpoints, so nothing clashes with a `make run` beside it),
# then `loadtest --chaos` for 30 s with the default mix, a process killed every 5 s. With
# BLOB_STORE=s3 the stack runs on a RADOS Gateway of its own, killed first. With STORE=postgres it
# runs on a PostgreSQL of its own with two replicas of quota, history and jobs (scripts/run.sh);
# CHAOS_ONLY names the processes killed (loadtest --chaos-only, e.g. the replicas, or postgres),
# CHAOS_FIRST those killed first, in order (loadtest --chaos-first),
# and CHAOS_THRESHOLDS (separated by ';') are loadtest --threshold criteria it must meet too.
# Fails when an invariant breaks or a threshold is crossed. Its figures and report stay in
# .build/chaos-check/ (a subfolder named after the store).
set -uo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-debug}
DURATION=${CHAOS_CHECK_DURATION:-30}

source scripts/stack-lib.sh
OUT=.build/chaos-check/${STORE:-sqlite}-${BLOB_STORE:-folder}${CHAOS_ONLY:+-${CHAOS_ONLY//,/-}}
mkdir -p "$OUT"
# Reservations whose creation answer was lost (the gateway killed mid-request) are resolved
# after 5 s rather than the default 2 minutes, so the check settles quickly.
# At info, the log dates each restart's "listening" (and its other lifecycle lines), so the tail a
# failure prints shows how long a killed process took to serve again; per-request lines are debug.
export QUOTA_STALE_AFTER_S=5 QUOTA_STALE_SCAN_MS=1000 LOG_LEVEL=${LOG_LEVEL:-info}
trap stack_kill EXIT
stack_start || { echo "chaos-check: the stack did not start"; exit 1; }

echo "chaos-check: ${DURATION} s of the default mix with a process killed every 5 s (store: ${STORE:-sqlite}, blobs: ${BLOB_STORE:-folder}${CHAOS_ONLY:+, killing only $CHAOS_ONLY})"
ARGS=()
FIRST=${CHAOS_FIRST:-}
[ "${BLOB_STORE:-folder}" = s3 ] && FIRST=radosgw${FIRST:+,$FIRST}
[ -n "$FIRST" ] && ARGS+=(--chaos-first "$FIRST")
[ -n "${CHAOS_ONLY:-}" ] && ARGS+=(--chaos-only "$CHAOS_ONLY")
IFS=';' read -ra thresholds <<< "${CHAOS_THRESHOLDS:-}"
for threshold in "${thresholds[@]}"; do [ -n "$threshold" ] && ARGS+=(--threshold "$threshold"); done
"$BIN/loadtest" --duration "$DURATION" --chaos --chaos-interval 5 --settle 120 "${ARGS[@]}" \
  --json "$OUT/loadtest.json" --report "$OUT/loadtest.html"
status=$?
if [ "$status" -ne 0 ]; then
  cp "$DIR/stack.log" "$OUT/stack.log"
  echo "chaos-check: FAILED; the stack's last log lines (all of it in $OUT/stack.log):"
  tail -120 "$DIR/stack.log"
  # What the tail may have scrolled past: each warning and error (a failing store is logged once,
  # when it begins to fail).
  echo "chaos-check: the stack's warnings and errors:"
  grep -E '^[^ ]+ (warning|error|critical) ' "$DIR/stack.log" | tail -60
  if [ -d "$DIR/s3/log" ]; then
    # The RADOS Gateway's own account: its requests that took a second or more (its access lines,
    # "beast: ... latency=Ns", at its default log level, without presigned URLs' queries), and its
    # daemons' logs kept beside the stack's (not the folder's other files: the user's creation
    # printed its secret key).
    rm -rf "$OUT/s3-log" && mkdir -p "$OUT/s3-log" && cp "$DIR"/s3/log/*.log "$OUT/s3-log/"
    echo "chaos-check: the RADOS Gateway's requests of a second or more (its logs in $OUT/s3-log):"
    grep -h ' beast: ' "$DIR"/s3/log/client.rgw*.log 2>/dev/null |
      awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^latency=/) { split($i, a, "="); if (a[2] + 0 >= 1) print } }' |
      sed 's/?[^ "]*//' | tail -40
  fi
fi
exit "$status"
