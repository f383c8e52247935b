#!/usr/bin/env bash
# Faults of whole hosts and of the network, on the topology of scripts/hosts.sh (an edge with
# HAProxy, two gateways, two service hosts with a replica each of quota, history and jobs, a db
# host with PostgreSQL, an s3 host with the RADOS Gateway, two worker hosts; the bus on CURVE).
# For each fault, `loadtest` drives the default mix plus model edits at the provider fixture
# (a video at fal among them) through the edge at a steady rate; the fault starts at 10 s, is
# healed 12 s later (longer than every timer a fault trips: the worker heartbeats' 3 s, the
# database probes' 3 s, the leader's 1 s lease), and the load goes on 18 s more. Then the chaos
# check's invariants: every admitted job ends, once; charges equal the completed jobs' prices with
# no reservation left; admission never past a user's credits, across replicas; every result
# downloads; history lists each job once; no 5xx but 503, nor an unanswered request, outside the
# fault and 12 s after it.
# Prints a table: fault, requests, share answered during and after it, time until the earlier
# rate came back, invariants. Exits 0 only if every invariant held under every fault.
#
# HOSTS_CHAOS_ONLY (names, comma-separated) runs only those faults; HOSTS_CHAOS_RATE the load's
# sessions a second (default 2). Figures and reports: .build/hosts-chaos/; each host's logs are
# kept there too when a fault fails.
set -uo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "hosts-chaos: needs root (network namespaces)"; exit 1; }
OUT=.build/hosts-chaos
rm -rf "$OUT"; mkdir -p "$OUT"
scripts/swift-build.sh --build-tests || exit 1
BIN=$(scripts/swift-build.sh --show-bin-path)
DIR=$(mktemp -d /tmp/pe-hosts.XXXXXX)
H="$PWD/scripts/hosts.sh"
cleanup() { "$H" down "$DIR" >/dev/null 2>&1; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
# Each host's logs, kept under $OUT/$1.
keep_logs() {
  local host
  for host in edge gw1 gw2 svc1 svc2 db s3 wk1 wk2; do mkdir -p "$OUT/$1"; cp -r "$DIR/$host/log" "$OUT/$1/$host" 2>/dev/null; done
}
LOG_LEVEL=info "$H" up "$DIR" || { echo "hosts-chaos: the hosts did not come up (their logs: $OUT/up-logs)"; keep_logs up-logs; exit 1; }
set -a; source "$DIR/root/loadtest.env"; set +a

# The mix: the default flows, with model edits at the fixture (an image at Gemini, a video at fal)
# beside the built-in effects, so that a partitioned worker may hold a generation at a provider.
cat > "$OUT/mix.json" <<'EOF'
{"effects": {"copy": 4, "grayscale": 3, "auto-enhance": 2, "blur": 1, "nano-banana": 2, "veo": 2}}
EOF

# NAME FAULT HEAL: one run of loadtest with that fault (shell commands; $F is the file a fault
# notes the host it picked in, for its heal).
F="$DIR/root/faulted"
results=()
# Waits (up to a minute) for the edge's /readyz to answer 200.
edge_ready() { for _ in $(seq 1 120); do curl -fsS "$LOADTEST_TARGET/readyz" >/dev/null 2>&1 && return 0; sleep 0.5; done; }
run_fault() {
  local name=$1 fault=$2 heal=$3
  if [ -n "${HOSTS_CHAOS_ONLY:-}" ] && [[ ",$HOSTS_CHAOS_ONLY," != *",$name,"* ]]; then return 0; fi
  echo "hosts-chaos: $name"
  # loadtest checks the edge's /readyz once, at its start.
  edge_ready
  # (Bounded: 40 s of load, 20 s of drain, up to 180 s to settle, and a margin.)
  timeout -k 10 420 "$BIN/loadtest" --duration 40 --rate "${HOSTS_CHAOS_RATE:-2}" --config "$OUT/mix.json" --settle 180 \
    --fault-name "$name" --fault-command "$fault" --heal-command "$heal" --fault-at 10 --fault-for 12 --fault-recovery 12 \
    --json "$OUT/$name.json" --report "$OUT/$name.html" > "$OUT/$name.txt" 2>&1
  local status=$?
  sed -n '/^fault /p; /^invariants:/,$p' "$OUT/$name.txt"
  if [ "$status" -ne 0 ]; then
    echo "hosts-chaos: $name FAILED (status $status; all of it in $OUT/$name.txt, the hosts' logs in $OUT/$name-logs)"
    keep_logs "$name-logs"
  fi
  results+=("$name:$status")
  # The next fault starts from a whole system: every partition undone (a run cut short by its
  # time limit may not have healed its own), every host back and ready.
  local host
  for host in edge gw1 gw2 svc1 svc2 db s3 wk1 wk2; do "$H" heal "$DIR" "$host"; done
  edge_ready
}

leader="h=\$('$H' leader '$DIR') && echo \$h > '$F'"
other="h=\$('$H' leader '$DIR') && { [ \$h = svc1 ] && echo svc2 || echo svc1; } > '$F'"
run_fault crash-leader-host "$leader && '$H' crash '$DIR' \$h" "'$H' boot '$DIR' \$(cat '$F')"
run_fault partition-leader-host "$leader && '$H' partition '$DIR' \$h" "'$H' heal '$DIR' \$(cat '$F')"
run_fault partition-follower-host-from-db "$other && '$H' partition '$DIR' \$(cat '$F') db" "'$H' heal '$DIR' \$(cat '$F')"
run_fault partition-leader-host-from-db "$leader && '$H' partition '$DIR' \$h db" "'$H' heal '$DIR' \$(cat '$F')"
run_fault partition-s3-from-gateways "'$H' partition '$DIR' s3 gw1 gw2" "'$H' heal '$DIR' s3"
# wk1 takes the videos: the partition waits (up to 20 s) for a generation waiting at fal, so the
# worker cut off holds one (its grace, JOBS_LOST_WORKER_GRACE_S, outlasts the partition).
waiting="for i in \$(seq 1 100); do curl -fsS \$(cat '$DIR/root/fixture.url')/_fixture/stats | grep -q '\"falRequestsWaiting\":[1-9]' && break; sleep 0.2; done"
run_fault partition-worker-host-holding-a-video "$waiting; '$H' partition '$DIR' wk1" "'$H' heal '$DIR' wk1"
run_fault partition-leader-from-other-service-host "$leader && '$H' partition '$DIR' \$h \$([ \$h = svc1 ] && echo svc2 || echo svc1)" \
  "'$H' heal '$DIR' \$(cat '$F')"

echo
python3 - "$OUT" "${results[@]}" <<'EOF'
import json, sys
out, results = sys.argv[1], sys.argv[2:]
print(f"{'fault':42} {'requests':>9} {'answered during':>16} {'after':>8} {'rate back':>10}  invariants")
for item in results:
    name, status = item.rsplit(":", 1)
    try:
        run = json.load(open(f"{out}/{name}.json"))
    except (OSError, ValueError):
        print(f"{name:42} {'(no figures: loadtest exited ' + status + ')'}")
        continue
    f = run.get("fault") or {}
    held = [i for i in run["invariants"] if i["held"]]
    broken = [i["name"] for i in run["invariants"] if not i["held"]]
    back = f.get("recoverySeconds")
    print(f"{name:42} {run['requests']:>9} {100 * f.get('successDuring', 0):>15.1f}% {100 * f.get('successAfter', 0):>7.1f}% "
          f"{(f'{back:.0f} s' if back is not None else 'never'):>10}  {len(held)}/{len(run['invariants'])} held"
          + (f"; BROKEN: {', '.join(broken)}" if broken else ""))
EOF
failed=0
for item in "${results[@]}"; do [ "${item##*:}" = 0 ] || failed=1; done
[ "$failed" -eq 0 ] && echo "hosts-chaos: every invariant held under every fault" || echo "hosts-chaos: FAILED"
exit "$failed"
