#!/usr/bin/env bash
# Runs the whole `make test` N times in a row (default 3) and says how each run ended, how long it
# took, and which tests failed in which runs: the check that the suite passes every time, not
# once on an idle machine.
#
#   scripts/soak-tests.sh [N]
#   LOAD=1 scripts/soak-tests.sh [N]     the same with one core kept busy throughout
#                                        (Debian's stress-ng, one CPU worker)
#
# Each run's whole output is kept in .build/soak/TIME/run-K.log (TIME when the soak started), and
# so is the chaos checks' report of a failed run. Exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
out=.build/soak/$(date -u +%Y%m%dT%H%M%S)$([ "${LOAD:-0}" = 1 ] && echo -load)
mkdir -p "$out"
echo "soak: logs in $out"

hog=""
if [ "${LOAD:-0}" = 1 ]; then
    if ! command -v stress-ng >/dev/null; then
        sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
        $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq stress-ng >/dev/null
    fi
    stress-ng --cpu 1 --cpu-load 100 --quiet &
    hog=$!
    trap '[ -n "$hog" ] && kill "$hog" 2>/dev/null; wait 2>/dev/null' EXIT
    echo "soak: one core kept busy by stress-ng (pid $hog)"
fi

declare -a results
failed_runs=0
for run in $(seq 1 "$runs"); do
    log="$out/run-$run.log"
    echo "soak: run $run of $runs ($(date -u +%H:%M:%S))"
    start=$(date +%s)
    make test > "$log" 2>&1
    status=$?
    [ "$status" -ne 0 ] && [ -d .build/chaos-check ] && cp -r .build/chaos-check "$out/chaos-check-$run"
    seconds=$(( $(date +%s) - start ))
    if [ "$status" -eq 0 ]; then verdict=passed; else verdict="FAILED (exit $status)"; failed_runs=$((failed_runs + 1)); fi
    results+=("$(printf '| %d | %s | %dm%02ds |' "$run" "$verdict" $((seconds / 60)) $((seconds % 60)))")
    echo "soak: run $run $verdict in $((seconds / 60))m$((seconds % 60))s"
done

echo
echo "soak: $runs runs of make test$([ "${LOAD:-0}" = 1 ] && echo ", one core kept busy (LOAD=1)")"
echo
echo "| run | result | time |"
echo "|---|---|---|"
printf '%s\n' "${results[@]}"
echo
# Every test that failed in any run (Swift Testing's '✘ Test NAME ... failed'), every script check
# that failed (make's 'Error' line names its recipe line), and tests a run was stopped in.
python3 - "$out" "$runs" <<'EOF'
import collections, re, sys
folder, runs = sys.argv[1], int(sys.argv[2])
failures = collections.defaultdict(set)
makefile = open("Makefile").read().splitlines()
for run in range(1, runs + 1):
    try:
        lines = open(f"{folder}/run-{run}.log", errors="replace").read().splitlines()
    except FileNotFoundError:
        continue
    hung = False
    for line in lines:
        test = re.search(r"✘ Test (\S+\(.*?\))(?: with \d+ test cases?)? failed", line)
        if test:
            failures[f"test {test.group(1)}"].add(run)
        if "outlasted its" in line:
            hung = True
        elif hung and line.startswith("  ") and "(" in line:
            failures[f"hung {line.strip()}"].add(run)
        check = re.search(r"make: \*\*\* \[Makefile:(\d+): test\] Error", line)
        if check:
            step = makefile[int(check.group(1)) - 1].strip() if int(check.group(1)) <= len(makefile) else "?"
            failures[f"step `{step}` (Makefile line {check.group(1)})"].add(run)
if not failures:
    print("failed in any run: none")
else:
    print("| failed | runs |")
    print("|---|---|")
    for name, which in sorted(failures.items()):
        print(f"| {name} | {', '.join(map(str, sorted(which)))} |")
EOF
[ "$failed_runs" -eq 0 ]
