#!/usr/bin/env bash
# The app as the seed documents (../shared/seeds/) write it, against a live stack: starts a stack
# of its own (scripts/stack-lib.sh: scripts/run.sh on free ports and a temporary folder) and
# plays the seeds' flows through its gateway, field by field, decoding every answer with the
# seeds' own models (Tests/SystemTests/SeedContractTests.swift): the Chat screen (users/me,
# presign, a PUT with only Content-Type, the create request, status polled every 2 s, the result
# downloaded, the paywall's 429 at 0 credits, the Adapty purchase), the History screen (list,
# search, month sections, thumbnails, re-run, share, delete with its files gone), the older
# build's routes and the models' prices, and the client library's JSON-lines cache synced from
# the changes feed. Prints one line per decoded answer.
#
#   scripts/seed-contract.sh                   the default stack (SQLite, blob folder)
#   BLOB_STORE=s3 scripts/seed-contract.sh     on a RADOS Gateway of its own
#   STORE=postgres scripts/seed-contract.sh    on a PostgreSQL of its own
#
# The tests must be built (`scripts/swift-build.sh --build-tests`; make test does it first).
set -uo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-debug}
export WORKERS=${WORKERS:-2} LOG_LEVEL=${LOG_LEVEL:-info}
name="store: ${STORE:-sqlite}, blobs: ${BLOB_STORE:-folder}"

source scripts/stack-lib.sh
trap stack_kill EXIT
stack_start || { echo "seed-contract: the stack did not start ($name)"; exit 1; }

SEED_CONTRACT_URL="http://127.0.0.1:$GATEWAY_PORT" SEED_CONTRACT_STACK="$name" \
  scripts/swift-test.sh 10 --filter SeedContractTests > "$DIR/contract.log" 2>&1
status=$?
grep -a '^seed-contract \[' "$DIR/contract.log"
if [ $status -ne 0 ] || ! grep -aq 'Test theAppsFlowsAsTheSeedsWriteThem() passed' "$DIR/contract.log"; then
  echo "seed-contract: FAILED ($name):"
  grep -aE '✘|recorded an issue|Expectation failed' "$DIR/contract.log" | head -40
  echo "seed-contract: the stack's last lines:"
  tail -40 "$DIR/stack.log"
  exit 1
fi
echo "seed-contract: every flow passed ($name)"
