#!/usr/bin/env bash
# `make loadtest [ARGS=...]`: builds loadtest and runs it against the stack `make run` started
# (same data folder, port and development secrets unless the environment says otherwise).
# The figures go to $DATA_DIR/loadtest.json and the report to $DATA_DIR/loadtest.html.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-debug}
DEV_ENV_QUIET=1 source scripts/dev-env.sh
scripts/swift-build.sh -c "$CONFIG" --product loadtest
BIN=$(scripts/swift-build.sh -c "$CONFIG" --show-bin-path)
mkdir -p "$DATA_DIR"
# shellcheck disable=SC2086 # ARGS is a list of flags
exec "$BIN/loadtest" --json "$DATA_DIR/loadtest.json" --report "$DATA_DIR/loadtest.html" ${ARGS:-}
