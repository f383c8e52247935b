#!/usr/bin/env bash
# Ctrl-C stops the whole stack: a stack of its own (scripts/stack-lib.sh: `scripts/run.sh` in a
# session of its own, as a terminal runs it) with WORKERS workers (default 3), the app's flows
# running against it (loadtest, so jobs are in flight), then SIGINT to the whole process group,
# which is what a terminal's Ctrl-C and `kill -INT -- -PGID` send. Passes when every process of
# the stack is gone within STOP_WITHIN seconds (default 10): the services, the workers, their
# supervisors, run.sh itself, and with STORE=postgres or BLOB_STORE=s3 the PostgreSQL or RADOS
# Gateway run.sh started, and nothing of it was started again meanwhile. With KILL_AFTER_MS=N, the
# whole process group is also sent SIGKILL N ms after the SIGINT (someone who pressed Ctrl-C
# and then killed what still ran): run.sh's shutdown never finishes, and the PostgreSQL and RADOS
# Gateway it started, in sessions of their own, must still be gone (run.sh's reaper stops them).
#
#   scripts/stop-check.sh                   the default stack
#   BLOB_STORE=s3 scripts/stop-check.sh     on a RADOS Gateway of its own
#   STORE=postgres scripts/stop-check.sh    on a PostgreSQL of its own, two replicas of each service
#   STORE=postgres BLOB_STORE=s3 KILL_AFTER_MS=300 scripts/stop-check.sh   both; SIGKILL after SIGINT
set -uo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-debug}
WITHIN=${STOP_WITHIN:-10}
export WORKERS=${WORKERS:-3} LOG_LEVEL=${LOG_LEVEL:-info}
KILL_AFTER=${KILL_AFTER_MS:-}
name="store: ${STORE:-sqlite}, blobs: ${BLOB_STORE:-folder}, $WORKERS workers${KILL_AFTER:+, SIGKILL $KILL_AFTER ms after SIGINT}"

source scripts/stack-lib.sh
load=""
cleanup() {
  [ -n "$load" ] && kill "$load" 2>/dev/null
  stack_kill
}
trap cleanup EXIT
stack_start || { echo "stop-check: the stack did not start ($name)"; exit 1; }

# The app's flows, for longer than the check lasts: jobs are being created, run and read when
# the signal comes.
"$BIN/loadtest" --duration 120 --settle 0 > "$DIR/loadtest.log" 2>&1 &
load=$!
# Wait for work in flight: jobs run by the workers (the jobs service's results, through the
# gateway's /metrics), with the app's flows still creating more.
results() {
  curl -fsS "http://127.0.0.1:$GATEWAY_PORT/metrics" 2>/dev/null \
    | awk '/^jobs_results_total/ { sum += $NF } END { print sum + 0 }'
}
# (Up to 3 minutes: a bound that holds on a busy machine.)
# One read decides: with two jobs replicas, the gateway's /metrics shows one replica's counters
# at a time, and the one not dispatching has none (a second read once failed a check whose first
# had seen 2 results).
ended=0
for _ in $(seq 1 1800); do
  ended=$(results)
  [ "$ended" -gt 0 ] 2>/dev/null && break
  sleep 0.1
done
if ! [ "$ended" -gt 0 ] 2>/dev/null; then
  echo "stop-check: FAILED ($name): no job ended within 180 s of the load's start; the load said:"
  tail -20 "$DIR/loadtest.log"
  echo "stop-check: the stack's last lines:"
  tail -40 "$DIR/stack.log"
  exit 1
fi
echo "stop-check: $ended jobs ended so far, the load still running; SIGINT to the stack's process group"

started=$(date +%s%3N)
kill -INT -- -"$STACK"
killed=""
left=""
while :; do
  if [ -n "$KILL_AFTER" ] && [ -z "$killed" ] && [ $(( $(date +%s%3N) - started )) -ge "$KILL_AFTER" ]; then
    kill -KILL -- -"$STACK" 2>/dev/null
    killed=1
  fi
  left=$(stack_processes)
  [ -z "$left" ] && { [ -z "$KILL_AFTER" ] || [ -n "$killed" ]; } && break
  [ $(( $(date +%s%3N) - started )) -gt $(( WITHIN * 1000 )) ] && break
  sleep 0.1
done
took=$(( $(date +%s%3N) - started ))
if [ -n "$left" ]; then
  # What each process left is doing (every thread's stack, when gdb is there), then the stack's
  # last lines, then the processes: a CI log shows its end first.
  if command -v gdb >/dev/null; then
    for pid in $left; do
      echo "stop-check: the threads of $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-100) ($pid):"
      timeout 60 gdb -p "$pid" -batch -ex 'thread apply all bt 30' 2>/dev/null \
        | grep -E '^(Thread|#)' | swift demangle --simplified | cut -c1-220
    done
  fi
  echo "stop-check: the stack's last lines:"
  tail -60 "$DIR/stack.log"
  echo "stop-check: FAILED ($name): $WITHIN s after SIGINT these still run:"
  ps -o pid,pgid,etimes,args -p "$(echo $left | tr ' ' ',')" 2>/dev/null | cut -c1-200
  exit 1
fi
if grep -q 'restarting' <(sed -n '/\[run\] stopping/,$p' "$DIR/stack.log"); then
  echo "stop-check: FAILED ($name): something was restarted after the stop began:"
  sed -n '/\[run\] stopping/,$p' "$DIR/stack.log" | grep 'restarting'
  exit 1
fi
if [ -n "$KILL_AFTER" ] && grep -q '^\[run\] stopped' "$DIR/stack.log"; then
  # (Not a failure: the stack stopped before the kill, so this run checked only the SIGINT.)
  echo "stop-check: note: run.sh had finished its stop before the SIGKILL came; the reaper was not needed this time"
fi
echo "stop-check: every process of the stack ($name) stopped $((took / 1000)).$(printf %03d $((took % 1000))) s after SIGINT"
STACK=""
rm -rf "$DIR"
