# Sourced by the checks that run a stack of their own (chaos-check.sh, stop-check.sh):
# `stack_start` starts `scripts/run.sh` in a session of its own (its process group is the stack's,
# as a terminal's would be) on a temporary data folder, a free port and ipc:// bus endpoints, so
# nothing clashes with a `make run` beside it, and waits for it to be ready. With BLOB_STORE=s3 it
# runs on a RADOS Gateway of its own, with STORE=postgres on a PostgreSQL of its own (run.sh).
# It sets DIR (the data folder), STACK (the pid of run.sh, and the stack's process group), BIN
# and GATEWAY_PORT; the stack's output goes to $DIR/stack.log. `stack_kill` ends whatever is left
# of it and removes its folder.

stack_start() {
  stack_start_once && return 0
  # A start that failed (once, a RADOS Gateway exited as it started, its log gone with the
  # folder): said, with the stack's last lines (above), and tried once more on new ports.
  echo "stack-lib: the stack did not start; once more, on new ports and a new folder"
  stack_kill
  stack_start_once
}

stack_start_once() {
  DIR=$(mktemp -d /tmp/pe-stack.XXXXXX)
  # PostgreSQL runs as its own user, which must reach its folder inside.
  chmod 755 "$DIR"
  export DATA_DIR=$DIR
  export GATEWAY_PORT
  GATEWAY_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local service upper
  for service in quota history jobs; do
    upper=${service^^}
    export "${upper}_BIND=ipc://$DIR/$service.ipc" "${upper}_ENDPOINT=ipc://$DIR/$service.ipc"
  done
  export JOBS_WORKER_BIND="ipc://$DIR/workers.ipc" JOBS_WORKER_ENDPOINT="ipc://$DIR/workers.ipc"
  # The gateway's own address for the URLs it signs: this start's port, not an earlier one's.
  export PUBLIC_BASE_URL="http://127.0.0.1:$GATEWAY_PORT"
  DEV_ENV_QUIET=1 source scripts/dev-env.sh
  if [ "${STORE:-sqlite}" = postgres ]; then
    export POSTGRES_PORT
    POSTGRES_PORT=$(scripts/free-port-pair.py)
  fi
  if [ "${BLOB_STORE:-folder}" = s3 ]; then
    # run.sh starts a RADOS Gateway in $DIR/s3 on this port (and the next, its monitor's).
    export S3_PORT
    S3_PORT=$(scripts/free-port-pair.py)
  fi
  # A debug build with the tests, as `make test` builds, and run.sh handed what was built
  # (RUN_BIN) instead of building a second time. Through scripts/swift-build.sh, so that this
  # build, in the caller's environment (STORE, BLOB_STORE, ...), finds nothing to compile.
  local flags=()
  [ "$CONFIG" = debug ] && flags=(--build-tests)
  scripts/swift-build.sh -c "$CONFIG" "${flags[@]}" || return 1
  BIN=$(scripts/swift-build.sh -c "$CONFIG" --show-bin-path)
  RUN_BIN=$BIN setsid scripts/run.sh > "$DIR/stack.log" 2>&1 &
  STACK=$!
  local _
  for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:$GATEWAY_PORT/readyz" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "the stack did not become ready; its last lines:"
  tail -50 "$DIR/stack.log"
  return 1
}

# The pids of every process left of the stack: its process group, and anything that runs from its
# folder (a server that left the group).
stack_processes() {
  { pgrep -g "$STACK" 2>/dev/null; pgrep -f -- "$DIR" 2>/dev/null; } | sort -un
}

stack_kill() {
  [ -n "${STACK:-}" ] || return 0
  kill -TERM -- -"$STACK" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$STACK" 2>/dev/null || break; sleep 0.2; done
  local pids
  pids=$(stack_processes)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  [ -d "${DIR:-}/postgres/data" ] && scripts/postgres-server.sh stop "$DIR/postgres" >/dev/null 2>&1
  rm -rf "$DIR"
}
