# Shared by the bench scripts (sourced): release builds, free ports, a scratch folder and the
# background processes, all cleaned up on exit.

# Builds each named product for release, quietly unless it fails; sets BIN. BENCH_BIN=DIR instead
# runs the binaries of DIR, built before (to measure two builds in turns on the same machine).
build_release() {
  if [ -n "${BENCH_BIN:-}" ]; then BIN=$(cd "$BENCH_BIN" && pwd); return 0; fi
  for product in "$@"; do
    scripts/swift-build.sh -c release --product "$product" >/dev/null 2>&1 || scripts/swift-build.sh -c release --product "$product"
  done
  BIN=$(scripts/swift-build.sh -c release --show-bin-path)
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

# profiled LABEL COMMAND...: runs COMMAND; with BENCH_PERF=DIR, under a system-wide perf profile
# (call graphs) in DIR/LABEL.data.
profiled() {
  if [ -z "${BENCH_PERF:-}" ]; then "${@:2}"; return; fi
  mkdir -p "$BENCH_PERF"
  perf record -q -a -g -F 999 -o "$BENCH_PERF/$1.data" -- "${@:2}" 2>/dev/null
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
# BENCH_KEEP=1 leaves the data folder behind (it says where). On an ext4 without a journal (this
# machine's), inodes deleted in the last seconds to three minutes are skipped, one lookup each,
# when a file is created in their block group: right after a run deletes its tens of thousands
# of files, creating one costs 0.3-0.7 ms instead of 35 us, and a benchmark that creates files
# (bench-models, bench-blobs) measures that. Keep the folders of runs meant to be compared, and
# delete them together after (docs/jobs.md).
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true
  if [ "${BENCH_KEEP:-}" = 1 ]; then echo "data kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Starts the debug build's stack (quota, history, jobs, one worker, the gateway) on free loopback
# ports with its data in $work, logs in $work/NAME.log, and waits until the gateway is ready;
# sets `gateway` to its URL. Variables exported before apply to every process; GATEWAY_ENV (an
# array of VAR=value) to the gateway alone. Used by the checks `make test` runs on a live stack.
# A port is free when chosen, not when bound: another process (a connection of the checks running
# beside, in the other lane) can take it in between, and the service that wanted it stops. So a
# stack that does not get ready is stopped and started again on new ports, up to three times.
start_debug_stack() {
  local try
  for try in 1 2 3; do
    start_debug_stack_once && return 0
    echo "the stack did not get ready (try $try of 3); the gateway's log:"; tail -20 "$work/gateway.log"
    kill "${stack_pids[@]}" 2>/dev/null || true
    wait "${stack_pids[@]}" 2>/dev/null || true
  done
  return 1
}

start_debug_stack_once() {
  stack_pids=()
  BIN=$(scripts/swift-build.sh --show-bin-path)
  export DATA_DIR=$work LOG_LEVEL=${LOG_LEVEL:-warning}
  export QUOTA_ENDPOINT="tcp://127.0.0.1:$(port)" HISTORY_ENDPOINT="tcp://127.0.0.1:$(port)" JOBS_ENDPOINT="tcp://127.0.0.1:$(port)"
  export QUOTA_BIND=$QUOTA_ENDPOINT HISTORY_BIND=$HISTORY_ENDPOINT JOBS_BIND=$JOBS_ENDPOINT
  export JOBS_WORKER_BIND="tcp://127.0.0.1:$(port)"
  export JOBS_WORKER_ENDPOINT=$JOBS_WORKER_BIND
  export GATEWAY_PORT=$(port)
  export PUBLIC_BASE_URL="http://127.0.0.1:$GATEWAY_PORT" URL_SIGNING_SECRET=${URL_SIGNING_SECRET:-stack-signing-secret}
  for name in quota history jobs worker; do "$BIN/$name" > "$work/$name.log" 2>&1 & stack_pids+=($!); done
  env ${GATEWAY_ENV[@]+"${GATEWAY_ENV[@]}"} "$BIN/gateway" > "$work/gateway.log" 2>&1 & stack_pids+=($!)
  pids+=("${stack_pids[@]}")
  gateway="http://127.0.0.1:$GATEWAY_PORT"
  local pid
  for _ in $(seq 1 150); do
    curl -fsS "$gateway/readyz" >/dev/null 2>&1 && return 0
    # One that has stopped (its port taken, say) will not come back: no use waiting.
    for pid in "${stack_pids[@]}"; do kill -0 "$pid" 2>/dev/null || return 1; done
    sleep 0.2
  done
  return 1
}

# Installs a pinned package from PyPI (pip itself from Debian if missing). Debian's own Python
# refuses installs outside a virtual environment unless told otherwise, hence the second try.
pip_install() {
  echo "installing $1"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null
  fi
  python3 -m pip install -q "$1" 2>/dev/null || python3 -m pip install -q --break-system-packages "$1"
}

# STORE=postgres benchmarks: a PostgreSQL of their own in a folder of its own (the server runs as
# the postgres user, which cannot enter $work), counting statements (pg_stat_statements), stopped
# and removed at exit; sets pg_dir and POSTGRES_URL. `statements` prints how many statements the
# photoedit database has run so far.
start_bench_postgres() {
  scripts/postgres-server.sh install
  pg_dir=$(mktemp -d /tmp/photoedit-bench-postgres.XXXXXX)
  # The services first: a jobs service whose PostgreSQL stopped first did not exit on SIGTERM.
  trap 'cleanup; scripts/postgres-server.sh stop "$pg_dir" >/dev/null 2>&1; rm -rf "$pg_dir"' EXIT
  POSTGRES_STATEMENT_STATS=1 scripts/postgres-server.sh start "$pg_dir" "$(port)" >/dev/null
  source "$pg_dir/postgres.env"
}
# With BENCH_PERF=DIR: PostgreSQL's 15 statements that took the longest and the rows written so far
# per table, to DIR/$1, and the statements' counts cleared.
top_statements() {
  [ -n "${BENCH_PERF:-}" ] || return 0
  scripts/postgres-server.sh query "$pg_dir" "SELECT calls, round(total_exec_time::numeric, 1) AS ms, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 150)
    FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 15" >"$BENCH_PERF/$1" 2>&1 || true
  # Rows written per table, and how many updates were HOT (no index touched).
  scripts/postgres-server.sh query "$pg_dir" "SELECT relname, n_tup_ins AS inserted, n_tup_upd AS updated, n_tup_hot_upd AS hot, n_tup_del AS deleted
    FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY n_tup_ins + n_tup_upd + n_tup_del DESC" >>"$BENCH_PERF/$1" 2>&1 || true
  scripts/postgres-server.sh query "$pg_dir" "SELECT pg_stat_statements_reset()" >/dev/null 2>&1 || true
}
statements() {
  scripts/postgres-server.sh query "$pg_dir" \
    "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'photoedit')"
}

