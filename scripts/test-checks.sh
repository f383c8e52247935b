#!/usr/bin/env bash
# The checks `make test` runs after the Swift suite, each on stacks of its own (temporary folders,
# free ports), in two lanes at once, then one alone:
#
#   lane 1 (its output as it comes): the chaos checks (scripts/chaos-check.sh) on SQLite, with
#     BLOB_STORE=s3, and on PostgreSQL with its replicas killed;
#   lane 2 (its output kept in .build/test-checks/lane-2.log, printed when it ends): the contract
#     conformance run, the seeds' flows on three stacks, the console in Chromium, Prometheus, the
#     trace, and Ctrl-C of four stacks;
#   then alone: PostgreSQL itself killed under load, whose bound on the slowest answer (6 s, the
#     gateway's 5 s deadline and a margin) is the one latency figure these checks assert.
#
# Most of these checks wait (for stacks to start, load to drain, a browser) more than they
# compute: one after another they kept a 2-core machine about half busy for 7.5 minutes. The
# lanes overlap that waiting. The chaos checks assert invariants, not latency; they passed in the
# soaks with one core kept busy by stress-ng (scripts/soak-tests.sh, LOAD=1), more than lane 2
# takes (4.3 minutes for both lanes, the machine 58% busy). Each lane stops at its first failure;
# the script fails if either lane or the last check does, and says which. TEST_CHECKS_SERIAL=1
# runs everything one after another.
#
# HOSTS_CHAOS=1 (CI's `make test`; root) also runs scripts/hosts-chaos.sh, the faults of hosts and
# of the network (8.5 minutes, the machine about 40% busy), with the lanes one after the other
# beside it (its output kept in .build/test-checks/hosts-chaos.log, printed when it ends), and
# lane 2's last check after it: two things at once, as without it, in about 9 minutes instead of
# 13 one after another.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=.build/test-checks
mkdir -p "$OUT"

# Runs each argument (a command line) in turn, stopping at the first that fails, and says how long
# each took (what CI's time is made of).
lane() {
  local command started
  for command in "$@"; do
    echo "+ $command"
    started=$SECONDS
    bash -c "$command" || { echo "test-checks: FAILED after $((SECONDS - started)) s: $command"; return 1; }
    echo "test-checks: $((SECONDS - started)) s: $command"
  done
}

lane1=(
  "scripts/chaos-check.sh"
  "BLOB_STORE=s3 scripts/chaos-check.sh"
  "STORE=postgres CHAOS_ONLY=quota,history,jobs CHAOS_FIRST=jobs-1,jobs-2 scripts/chaos-check.sh"
)
lane2=(
  "scripts/conformance.sh"
  "scripts/seed-contract.sh"
  "scripts/console-check.sh"
  "BLOB_STORE=s3 scripts/seed-contract.sh"
  "STORE=postgres scripts/seed-contract.sh"
  "scripts/prometheus-check.sh"
  "scripts/trace-check.sh"
  "scripts/stop-check.sh"
  "BLOB_STORE=s3 scripts/stop-check.sh"
  "STORE=postgres scripts/stop-check.sh"
  "STORE=postgres BLOB_STORE=s3 KILL_AFTER_MS=300 scripts/stop-check.sh"
)
last="STORE=postgres CHAOS_ONLY=postgres CHAOS_THRESHOLDS='max<6000ms' scripts/chaos-check.sh"

if [ -n "${TEST_CHECKS_SERIAL:-}" ]; then
  lane "${lane2[@]}" "${lane1[@]}" "$last" || exit 1
  [ -z "${HOSTS_CHAOS:-}" ] || lane scripts/hosts-chaos.sh
  exit
fi

# beside NAME LOG FOREGROUND... -- BACKGROUND...: runs the BACKGROUND commands (a lane) in a
# process group of their own (set -m, so that an interrupted run stops them and every stack they
# started), their output kept in LOG, while the FOREGROUND lane runs here; then prints LOG and
# fails if either lane did.
beside() {
  local name=$1 log=$2 foreground=() background_pid status1 status2
  shift 2
  while [ "$1" != -- ]; do foreground+=("$1"); shift; done
  shift
  set -m
  lane "$@" > "$log" 2>&1 &
  background_pid=$!
  set +m
  trap "kill -TERM -- -$background_pid 2>/dev/null; wait $background_pid 2>/dev/null; exit 130" INT TERM
  lane "${foreground[@]}"
  status1=$?
  wait "$background_pid"
  status2=$?
  trap - INT TERM
  echo "test-checks: $name (its output, kept in $log):"
  cat "$log"
  [ "$status1" -eq 0 ] || { echo "test-checks: FAILED beside $name (see above)"; return 1; }
  [ "$status2" -eq 0 ] || { echo "test-checks: FAILED in $name (see above)"; return 1; }
}

if [ -n "${HOSTS_CHAOS:-}" ]; then
  # Lane 2's last check goes after the hosts' faults, which take less time than the lanes (on
  # 2026-12-07: 540 s against 671, the check 70).
  lane2_but_last=("${lane2[@]:0:${#lane2[@]}-1}")
  beside hosts-chaos "$OUT/hosts-chaos.log" "${lane2_but_last[@]}" "${lane1[@]}" -- \
    scripts/hosts-chaos.sh "${lane2[-1]}" || exit 1
else
  beside "lane 2" "$OUT/lane-2.log" "${lane1[@]}" -- "${lane2[@]}" || exit 1
fi
lane "$last"
