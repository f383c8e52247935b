#!/usr/bin/env bash
# Runs a command with a PostgreSQL of its own (scripts/postgres-server.sh) in a temporary folder on
# a free port, its settings file named in PHOTOEDIT_TEST_POSTGRES_ENV (nothing else exported), and
# stops the server after, whatever the command does: `scripts/with-postgres.sh swift test --filter Postgres`.
# A throwaway server: no flushes (POSTGRES_THROWAWAY=1, see postgres-server.sh), and room for every
# pool the suite opens at once (each test's stores and service processes have pools of their own).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/postgres-server.sh install
dir=$(mktemp -d /tmp/photoedit-postgres.XXXXXX)
port=$(scripts/free-port-pair.py)
trap 'scripts/postgres-server.sh stop "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
POSTGRES_THROWAWAY=1 POSTGRES_MAX_CONNECTIONS=${POSTGRES_MAX_CONNECTIONS:-500} scripts/postgres-server.sh start "$dir" "$port" >/dev/null
export PHOTOEDIT_TEST_POSTGRES_ENV=$dir/postgres.env
"$@"
