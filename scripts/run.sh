#!/usr/bin/env bash
# Builds and runs the whole system on localhost: quota, history, jobs, the gateway and $WORKERS
# workers (default 2), each under a supervisor that restarts it if it crashes (its pid in
# $DATA_DIR/pids/NAME.pid), each log line labelled with its process. Ctrl-C (or SIGTERM) stops
# every process gracefully and waits for them.
set -uo pipefail
# A script's background job ignores SIGINT, and a shell cannot trap a signal ignored when it
# started: run again with SIGINT at its default, so that `kill -INT -- -PGID` from a script stops
# the stack as a terminal's Ctrl-C does (else only the services saw it, and this script and its
# watchdogs ran on).
if (( 0x$(awk '/^SigIgn:/ { print $2 }' /proc/$$/status) & 2 )); then
  exec env --default-signal=INT bash "$0" "$@"
fi
cd "$(dirname "$0")/.."

CONFIG=${CONFIG:-debug}
source scripts/dev-env.sh
mkdir -p "$DATA_DIR"
WORKERS=${WORKERS:-2}
# One NAME.pid per supervised process, rewritten at each restart (`loadtest --chaos` reads them).
PID_DIR="$DATA_DIR/pids"
mkdir -p "$PID_DIR"
rm -f "$PID_DIR"/*.pid
# Writes PID $2 as NAME $1's, when it changed, in one rename: `loadtest --chaos` reads these files
# at any moment, and one read between the truncation and the write of `echo >` found no process
# (chaos-check once failed so: "no live process").
write_pid() {
  [ "$(cat "$PID_DIR/$1.pid" 2>/dev/null)" = "$2" ] && return 0
  echo "$2" > "$PID_DIR/$1.pid.new" && mv -f "$PID_DIR/$1.pid.new" "$PID_DIR/$1.pid"
}

# RUN_BIN: the executables were built already, there (scripts/stack-lib.sh builds them as
# `make test` does).
if [ -n "${RUN_BIN:-}" ]; then
  BIN=$RUN_BIN
else
  scripts/swift-build.sh -c "$CONFIG" || exit 1
  BIN=$(scripts/swift-build.sh -c "$CONFIG" --show-bin-path)
fi

# BLOB_STORE=s3 without an S3_ENDPOINT: a local RADOS Gateway in $DATA_DIR/s3 (scripts/s3-server.sh)
# on S3_PORT (default 7480), bucket $S3_BUCKET (default photoedit), its settings exported; radosgw
# is restarted if it dies (its pid in $PID_DIR/radosgw.pid, so `loadtest --chaos` kills it too).
S3_DIR=""
if [ "${BLOB_STORE:-folder}" = s3 ] && [ -z "${S3_ENDPOINT:-}" ]; then
  S3_DIR="$DATA_DIR/s3"
  scripts/s3-server.sh install || exit 1
  scripts/s3-server.sh start "$S3_DIR" "${S3_PORT:-7480}" || exit 1
  source "$S3_DIR/s3.env"
fi

# STORE=postgres: quota, history and jobs on PostgreSQL (QUOTA_DATABASE_URL, HISTORY_DATABASE_URL,
# JOBS_DATABASE_URL; those not set: a local PostgreSQL 15 from Debian's package in
# $DATA_DIR/postgres on POSTGRES_PORT, default 7432, initdb included, one database for all, and
# restarted if it dies, its pid in $PID_DIR/postgres.pid), each served by QUOTA_REPLICAS,
# HISTORY_REPLICAS and JOBS_REPLICAS processes (default 2). Replica i of a service listens on its
# default port + 10 (i - 1) (quota 7101 and 7111, history 7102 and 7112, jobs 7103 and 7113, jobs'
# workers 7104 and 7114), or, when the service's *_BIND is ipc://NAME.ipc, on ipc://NAME-i.ipc;
# every caller is given all of a service's replicas, every worker all of jobs' worker endpoints.
PG_DIR=""
QUOTA_REPLICAS=${QUOTA_REPLICAS:-1}
HISTORY_REPLICAS=${HISTORY_REPLICAS:-1}
JOBS_REPLICAS=${JOBS_REPLICAS:-1}
# Replica $2 of the endpoint $1 (tcp://HOST:PORT or ipc://PATH.ipc).
replica_endpoint() {
  case "$1" in
    ipc://*) echo "${1%.ipc}-$2.ipc" ;;
    tcp://*) echo "${1%:*}:$(( ${1##*:} + 10 * ($2 - 1) ))" ;;
    *) echo "$1" ;;
  esac
}
# Every replica of the endpoint $1, $2 of them, separated by commas.
replica_endpoints() { local list="" index; for index in $(seq 1 "$2"); do list+="${list:+,}$(replica_endpoint "$1" "$index")"; done; echo "$list"; }
if [ "${STORE:-sqlite}" = postgres ]; then
  if [ -z "${QUOTA_DATABASE_URL:-}" ] || [ -z "${HISTORY_DATABASE_URL:-}" ] || [ -z "${JOBS_DATABASE_URL:-}" ]; then
    PG_DIR="$DATA_DIR/postgres"
    PG_PORT=${POSTGRES_PORT:-7432}
    scripts/postgres-server.sh install || exit 1
    scripts/postgres-server.sh start "$PG_DIR" "$PG_PORT" >/dev/null || exit 1
    source "$PG_DIR/postgres.env"
    export QUOTA_DATABASE_URL=${QUOTA_DATABASE_URL:-$POSTGRES_URL} HISTORY_DATABASE_URL=${HISTORY_DATABASE_URL:-$POSTGRES_URL} \
      JOBS_DATABASE_URL=${JOBS_DATABASE_URL:-$POSTGRES_URL}
  fi
  [ "$QUOTA_REPLICAS" -gt 1 ] || QUOTA_REPLICAS=2
  [ "$HISTORY_REPLICAS" -gt 1 ] || HISTORY_REPLICAS=2
  [ "$JOBS_REPLICAS" -gt 1 ] || JOBS_REPLICAS=2
fi
QUOTA_BIND=${QUOTA_BIND:-tcp://127.0.0.1:7101} HISTORY_BIND=${HISTORY_BIND:-tcp://127.0.0.1:7102} JOBS_BIND=${JOBS_BIND:-tcp://127.0.0.1:7103}
JOBS_WORKER_BIND=${JOBS_WORKER_BIND:-tcp://127.0.0.1:7104}
if [ "$QUOTA_REPLICAS" -gt 1 ]; then export QUOTA_ENDPOINT=$(replica_endpoints "$QUOTA_BIND" "$QUOTA_REPLICAS"); fi
if [ "$HISTORY_REPLICAS" -gt 1 ]; then export HISTORY_ENDPOINT=$(replica_endpoints "$HISTORY_BIND" "$HISTORY_REPLICAS"); fi
if [ "$JOBS_REPLICAS" -gt 1 ]; then
  export JOBS_ENDPOINT=$(replica_endpoints "$JOBS_BIND" "$JOBS_REPLICAS") JOBS_WORKER_ENDPOINT=$(replica_endpoints "$JOBS_WORKER_BIND" "$JOBS_REPLICAS")
fi
if [ "${STORE:-sqlite}" = postgres ]; then
  echo "[run] STORE=postgres: on PostgreSQL, quota ($QUOTA_ENDPOINT), history ($HISTORY_ENDPOINT), jobs ($JOBS_ENDPOINT; workers: $JOBS_WORKER_ENDPOINT)"
fi

# The bus runs with CURVE and callers known by key (secure by default): keys made once into
# $DATA_DIR/bus-keys.env by `photoedit keys`, each process started with its role's key, every
# service admitting those keys only, each method only from its roles (docs/bus.md). BUS_KEYS=off
# runs the bus in plain text (loopback only).
if [ "${BUS_KEYS:-on}" != off ]; then
  KEYS_FILE="$DATA_DIR/bus-keys.env"
  [ -f "$KEYS_FILE" ] || "$BIN/photoedit" keys --output "$KEYS_FILE" || exit 1
  set -a
  source "$KEYS_FILE"
  set +a
  echo "[run] bus: CURVE, callers known by key ($KEYS_FILE)"
fi

# MODELS=local: the provider fixture (a local server in Gemini's, OpenAI's and fal's shapes, made
# for tests) on FIXTURE_PORT (default 7490), three models configured against it (unless
# JOBS_EFFECTS is set) and the keys it takes, to try a model by hand:
#   photoedit edit photo.jpg --effect nano-banana --prompt "make it a watercolour" --wait
if [ "${MODELS:-}" = local ]; then
  FIXTURE_PORT=${FIXTURE_PORT:-7490}
  fixture="http://127.0.0.1:$FIXTURE_PORT"
  export GEMINI_API_KEY=${GEMINI_API_KEY:-test-gemini-key} OPENAI_API_KEY=${OPENAI_API_KEY:-test-openai-key} FAL_KEY=${FAL_KEY:-test-fal-key}
  export FIXTURE_GEMINI_KEY=$GEMINI_API_KEY FIXTURE_OPENAI_KEY=$OPENAI_API_KEY FIXTURE_FAL_KEY=$FAL_KEY
  # fal's webhooks are signed by the fixture's key, published where fal publishes its own.
  export FAL_WEBHOOK_JWKS_URL=${FAL_WEBHOOK_JWKS_URL:-$fixture/.well-known/jwks.json}
  export JOBS_EFFECTS=${JOBS_EFFECTS:-"[
    {\"id\": \"nano-banana\", \"title\": \"Nano Banana\", \"processor\": \"gemini\", \"model\": \"gemini-2.5-flash-image\", \"credits\": 2, \"endpoint\": \"$fixture\"},
    {\"id\": \"gpt-image\", \"title\": \"GPT Image\", \"processor\": \"openai\", \"model\": \"gpt-image-1\", \"credits\": 3, \"endpoint\": \"$fixture\"},
    {\"id\": \"veo\", \"title\": \"FalAI Veo 3.1\", \"processor\": \"fal\", \"model\": \"fal-ai/veo3.1/image-to-video\", \"kind\": \"video\", \"credits\": 4, \"endpoint\": \"$fixture\"}]"}
  FIXTURE_PORT=$FIXTURE_PORT "$BIN/provider-fixture" 2>&1 &
  fixture_pid=$!
  echo "[run] MODELS=local: provider fixture at $fixture; models nano-banana (Gemini), gpt-image (OpenAI), veo (fal, video)"
fi

# Once the stack is stopping (Ctrl-C, SIGTERM), this file exists: nothing is restarted after it.
STOPPING="$PID_DIR/stopping"
rm -f "$STOPPING"
stopping() { [ -e "$STOPPING" ]; }

# Runs one process, restarting it after a crash until told to stop. A process that exits with
# status 0 was asked to stop (SIGTERM, or a SIGINT sent to the whole process group, which
# background shells of a script cannot trap): it is not restarted, nor is any process once the
# stack is stopping.
supervise() {
  local name=$1 label=${2:-$1} child=0 stop=0 status
  trap 'stop=1; [ "$child" -gt 0 ] && kill -TERM "$child" 2>/dev/null' TERM INT
  while [ "$stop" -eq 0 ] && ! stopping; do
    "$BIN/$name" 2>&1 &
    child=$!
    write_pid "$label" "$child"
    wait "$child"; status=$?
    while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done
    [ "$stop" -eq 1 ] && break
    if [ "$status" -eq 0 ]; then
      echo "[run] $label stopped"
      break
    fi
    stopping && break
    echo "[run] $label exited with status $status; restarting in 1 s"
    sleep 1
  done
  rm -f "$PID_DIR/$label.pid"
}

pids=()
watchdogs=()
[ -n "${fixture_pid:-}" ] && pids+=("$fixture_pid")
# Each process's own bus key (empty with BUS_KEYS=off: none).
key_of() { local variable="$(echo "$1" | tr '[:lower:]' '[:upper:]')_BUS_CURVE_KEY"; echo "${!variable:-}"; }
BUS_CURVE_KEY=$(key_of gateway) supervise gateway &
pids+=($!)
# Quota, history and jobs: one process each, or replica i on replica_endpoint(*_BIND, i).
for service in quota:$QUOTA_REPLICAS history:$HISTORY_REPLICAS jobs:$JOBS_REPLICAS; do
  IFS=: read -r name count <<< "$service"
  if [ "$count" -gt 1 ]; then
    bind="$(echo "$name" | tr '[:lower:]' '[:upper:]')_BIND"
    for index in $(seq 1 "$count"); do
      (
        export "$bind=$(replica_endpoint "${!bind}" "$index")"
        [ "$name" = jobs ] && export JOBS_WORKER_BIND=$(replica_endpoint "$JOBS_WORKER_BIND" "$index")
        BUS_CURVE_KEY=$(key_of "$name") supervise "$name" "$name-$index"
      ) &
      pids+=($!)
    done
  else
    BUS_CURVE_KEY=$(key_of "$name") supervise "$name" &
    pids+=($!)
  fi
done
for index in $(seq 1 "$WORKERS"); do
  BUS_CURVE_KEY=$(key_of worker) WORKER_ID="worker-$index" supervise worker "worker-$index" &
  pids+=($!)
done
if [ -n "$PG_DIR" ]; then
  # PostgreSQL restarted if it dies, as radosgw below (`loadtest --chaos` kills it too).
  (
    trap 'exit 0' TERM INT
    while true; do
      pid=$(head -1 "$PG_DIR/data/postmaster.pid" 2>/dev/null)
      if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; then
        write_pid postgres "$pid"
      elif ! stopping; then
        echo "[run] postgres exited; restarting"
        scripts/postgres-server.sh start "$PG_DIR" "$PG_PORT" >/dev/null 2>&1 || sleep 0.5
      fi
      sleep 0.2
    done
  ) &
  watchdogs+=($!)
fi
if [ -n "$S3_DIR" ]; then
  (
    trap 'exit 0' TERM INT
    while true; do
      pid=$(cat "$S3_DIR/run/rgw.pid" 2>/dev/null)
      if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = radosgw ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; then
        write_pid radosgw "$pid"
      elif ! stopping; then
        echo "[run] radosgw exited; restarting"
        scripts/s3-server.sh rgw "$S3_DIR" || sleep 1
      fi
      sleep 0.2
    done
  ) &
  watchdogs+=($!)
fi

# Killed (SIGKILL; or Ctrl-C, then a kill before the stop ended), this script runs no shutdown,
# and PostgreSQL and radosgw, in sessions of their own, would run on. So a reaper in a session of
# its own waits for this script to end, whichever way it ends, then marks the stack as stopping
# (a watchdog left running restarts nothing) and stops them (at once when they stopped already).
# `setsid -f` forks: the reaper is no child of this script, so this script's `wait`s never see it
# (as a child in a session of its own, one left the shutdown's `wait` hanging once).
if [ -n "$PG_DIR$S3_DIR" ]; then
  setsid -f bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
    touch "$2" 2>/dev/null
    [ -n "$3" ] && scripts/s3-server.sh stop "$3"
    [ -n "$4" ] && scripts/postgres-server.sh stop "$4"' reaper "$$" "$STOPPING" "$S3_DIR" "$PG_DIR" >/dev/null 2>&1 </dev/null
fi

# The watchdogs first (nothing is restarted from now on), then every supervised process (SIGTERM:
# each stops gracefully; a worker whose jobs service is gone stops too, handing back its jobs),
# then the stores under them. A SIGINT to the whole process group (Ctrl-C) reaches the services
# and workers at the same time as this script; PostgreSQL and radosgw run in sessions of their own
# and are stopped here, last.
shutdown() {
  trap '' INT TERM
  touch "$STOPPING"
  echo "[run] stopping..."
  [ ${#watchdogs[@]} -gt 0 ] && kill -TERM "${watchdogs[@]}" 2>/dev/null
  kill -TERM "${pids[@]}" 2>/dev/null
  wait "${watchdogs[@]}" "${pids[@]}" 2>/dev/null
  [ -n "$S3_DIR" ] && scripts/s3-server.sh stop "$S3_DIR"
  [ -n "$PG_DIR" ] && scripts/postgres-server.sh stop "$PG_DIR"
  echo "[run] stopped"
  exit 0
}
trap shutdown INT TERM

# Probed where it listens (loopback stands in for every interface).
case "${GATEWAY_HOST:-127.0.0.1}" in 0.0.0.0|::|"[::]") probe_host=127.0.0.1 ;; *) probe_host=${GATEWAY_HOST:-127.0.0.1} ;; esac
url="http://$probe_host:$GATEWAY_PORT"
for _ in $(seq 1 100); do
  if curl -fsS "$url/readyz" >/dev/null 2>&1; then
    echo "[run] ready: gateway at $url (data in $DATA_DIR, blobs: ${BLOB_STORE:-folder}; Ctrl-C stops everything)"
    break
  fi
  sleep 0.2
done
wait "${pids[@]}" "${watchdogs[@]}"
