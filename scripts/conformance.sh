#!/usr/bin/env bash
# Contract conformance: starts quota, history, jobs, a worker and the gateway (the debug build
# `make test` made) on free ports with data in a scratch folder, and runs schemathesis against
# openapi.yaml: every operation, examples, coverage (positive and negative data), fuzzing and
# stateful links, as a guest (X-Device-Id) and for the admin routes with the admin token, with
# every check (--checks all; scripts/schemathesis.toml has the one exception and says why). It
# passes only with no failure of any check.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
SCHEMATHESIS_VERSION=4.32.5
# Run through the interpreter, so a pip without its scripts folder on PATH still works.
schemathesis() { python3 -m schemathesis.cli "$@"; }
if [ "$(schemathesis --version 2>/dev/null | awk '{print $NF}')" != "$SCHEMATHESIS_VERSION" ]; then
  pip_install "schemathesis==$SCHEMATHESIS_VERSION"
fi
MAX_EXAMPLES=${CONFORMANCE_EXAMPLES:-25}
# The data schemathesis generates comes from its seed: 1 by default (make test checks the same
# data every time, deterministically), CONFORMANCE_SEED=random for a new seed each run (to look
# somewhere new), or a number; a failure names the seed, and CONFORMANCE_SEED=N runs it again.
SEED=${CONFORMANCE_SEED:-1}
[ "$SEED" = random ] && SEED=$(python3 -c 'import random; print(random.randrange(1, 2**31))')
echo "conformance: schemathesis seed $SEED (CONFORMANCE_SEED=$SEED repeats it)"

export JWT_SECRET="conformance-jwt-secret-0123456789abcdef" ADMIN_TOKEN=conformance-admin
export ADAPTY_WEBHOOK_SECRET=conformance-adapty URL_SIGNING_SECRET=conformance-signing OPENAPI_FILE=$PWD/openapi.yaml
start_debug_stack
url=$gateway

checks=all
run() {
  schemathesis --config-file scripts/schemathesis.toml run openapi.yaml --url "$url" --checks "$checks" --max-examples "$MAX_EXAMPLES" --request-timeout 10 \
    --seed "$SEED" $([ "$SEED" = 1 ] && echo --generation-deterministic) --report junit --report-dir "$work/reports" "$@"
}
status=0
echo "== as a guest"
run -H "X-Device-Id: $(python3 -c 'import uuid; print(uuid.uuid4())')" --exclude-path-regex '^/admin' || status=1
echo "== the admin routes, with the admin token"
run -H "Authorization: Bearer $ADMIN_TOKEN" --include-path-regex '^/admin' --phases examples,coverage,fuzzing || status=1
if [ "$status" -ne 0 ]; then
  echo "conformance failed; the gateway's log:"; tail -50 "$work/gateway.log"
  echo "conformance failed with schemathesis seed $SEED: CONFORMANCE_SEED=$SEED scripts/conformance.sh runs the same data again"
fi
exit $status
