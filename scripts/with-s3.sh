#!/usr/bin/env bash
# Runs a command with a RADOS Gateway of its own (scripts/s3-server.sh) in a temporary folder on a
# free port, its settings file named in PHOTOEDIT_TEST_S3_ENV (nothing else exported), and stops the
# gateway after, whatever the command does: `scripts/with-s3.sh swift test --filter S3`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/s3-server.sh install
dir=$(mktemp -d /tmp/photoedit-s3.XXXXXX)
port=$(scripts/free-port-pair.py)
trap 'scripts/s3-server.sh stop "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
# On every address: the two-host tests' worker reaches it from a network namespace over a veth pair.
S3_BIND=0.0.0.0 scripts/s3-server.sh start "$dir" "$port" >/dev/null
export PHOTOEDIT_TEST_S3_ENV=$dir/s3.env
"$@"
