# Shared by the bench scripts (sourced): release builds, free ports, a scratch folder and the
# background processes, all cleaned up on exit.

# Builds each named product for release, quietly unless it fails; sets BIN.
build_release() {
  for product in "$@"; do
    swift build -c release --product "$product" >/dev/null 2>&1 || swift build -c release --product "$product"
  done
  BIN=$(swift build -c release --show-bin-path)
}

# A TCP port on loopback that nothing listens on right now.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Installs Debian's PACKAGE unless COMMAND is on the PATH.
need() {
  command -v "$1" >/dev/null && return 0
  echo "installing $2"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
}

# Prints "req/s p50_ms p99_ms" of a wrk run at 32 connections for $DURATION seconds (wrk's own
# arguments after); fails on answers that are not 2xx.
# With BENCH_PERF=DIR, each measurement also records a system-wide perf profile (call graphs) in
# DIR/LABEL.data, LABEL from MEASURE_LABEL; read it with `perf report -i FILE --sort comm,dso`.
measure() {
  local out perf_pid=""
  if [ -n "${BENCH_PERF:-}" ]; then
    mkdir -p "$BENCH_PERF"
    perf record -q -a -g -F 999 -o "$BENCH_PERF/${MEASURE_LABEL:-run}.data" -- sleep "$DURATION" >/dev/null 2>&1 & perf_pid=$!
  fi
  out=$(wrk -t2 -c32 -d"${DURATION}s" --latency "$@" 2>&1)
  if [ -n "$perf_pid" ]; then wait "$perf_pid" || true; fi
  if echo "$out" | grep -q "Non-2xx"; then
    # MEASURE_ALLOW_ERRORS=1: a route measured past its capacity; its errors are reported, not fatal.
    if [ -n "${MEASURE_ALLOW_ERRORS:-}" ]; then
      echo "$(echo "$out" | sed -n 's/^ *Non-2xx or 3xx responses: *//p') non-2xx answers for $*" >&2
    else
      echo "non-2xx answers for $*:" >&2; echo "$out" >&2; exit 1
    fi
  fi
  echo "$out" | python3 -c '
import re, sys
text = sys.stdin.read()
def ms(label):
    m = re.search(r"^\s*" + label + r"%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
print("%.0f %.2f %.2f" % (rps, ms("50"), ms("99")))'
}

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
