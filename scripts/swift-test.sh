#!/usr/bin/env bash
# Runs the built tests (what `swift test --skip-build ARGS...` runs) and bounds the whole run:
# `make test` calls each part of the suite through it.
#
#   scripts/swift-test.sh MINUTES ARGS...      ARGS: Swift Testing's --filter, --skip, --no-parallel
#
# It runs the test bundle itself, not `swift test`: swift test evaluates the packages' manifests
# again in the caller's environment, which differs each time (a test server's settings file), and
# the next build then compiled package modules again (see scripts/swift-build.sh).
#
# Every suite has its own time limit (Swift Testing's `.timeLimit`), which fails a test that
# outlasts it and cancels it. A test that ignores its cancellation would still hold the run, so
# past MINUTES the run is stopped (the test process and every process it started: `timeout` signals
# its whole process group) and each test that started and never ended is named. The exit status
# is the tests', or 124 when the run was stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 MINUTES [swift test arguments]" >&2; exit 2; }
minutes=$1
shift
log=$(mktemp /tmp/photoedit-swift-test.XXXXXX)
trap 'rm -f "$log"' EXIT

bundle=$(ls -d "$(scripts/swift-build.sh --show-bin-path)"/*PackageTests.xctest 2>/dev/null | head -1)
[ -x "$bundle" ] || { echo "swift-test: no test bundle built; run scripts/swift-build.sh --build-tests first" >&2; exit 2; }
NO_COLOR=1 timeout --kill-after=20 "${minutes}m" "$bundle" --testing-library swift-testing "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo
    echo "swift-test: the run outlasted its ${minutes} minutes and was stopped; tests that started and never ended:"
    # Swift Testing writes '◇ Test NAME started.' and, at its end, '✔ Test NAME passed after',
    # '✘ Test NAME failed after' (also '... with N test cases ...') or '➜ Test NAME skipped'.
    python3 - "$log" <<'EOF'
import re, sys, collections
open_tests = collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    started = re.search(r"Test (\S+\(.*?\)) started\.", line)
    if started:
        open_tests[started.group(1)] += 1
        continue
    ended = re.search(r"Test (\S+\(.*?\))(?: with \d+ test cases?)? (?:passed|failed|skipped)", line)
    if ended and open_tests[ended.group(1)] > 0:
        open_tests[ended.group(1)] -= 1
hung = [name for name, count in open_tests.items() if count > 0]
for name in hung:
    print(f"  {name}")
if not hung:
    print("  (none seen: the run was stopped before its first test started, or after its last ended)")
EOF
    exit 124
fi
exit "$status"
