#!/usr/bin/env bash
# The operators' console in a real browser: Debian's Chromium and chromium-driver with PyPI's
# Selenium (installed here if missing), against a stack of its own (scripts/stack-lib.sh) with a
# viewer token and one `remote` effect whose model is the check's own HTTP server (it fails until
# fixed). scripts/console-check.py signs in, retries a failed job found by filter, pauses and
# resumes a provider, grants credits, reads as the viewer, and saves screenshots of the main pages
# (CONSOLE_SCREENSHOTS=DIR keeps them; docs/console/ holds the committed ones). Then the stack's
# log is read for the tokens and signed links, which must not be there.
#
# The tests must be built (`scripts/swift-build.sh --build-tests`; make test does it first).
set -uo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-debug}
SELENIUM_VERSION=4.51.0
source scripts/bench-lib.sh
need chromium chromium
need chromedriver chromium-driver
if [ "$(python3 -c 'import selenium; print(selenium.__version__)' 2>/dev/null)" != "$SELENIUM_VERSION" ]; then
  pip_install "selenium==$SELENIUM_VERSION"
fi

MODEL_PORT=$(port)
export VIEWER_TOKEN=console-check-viewer-token-$RANDOM$RANDOM
export ADMIN_TOKEN=console-check-admin-token-$RANDOM$RANDOM
export WORKERS=1 LOG_LEVEL=${LOG_LEVEL:-info}
export JOBS_EFFECTS="[{\"id\": \"fixable\", \"title\": \"Fixable model\", \"processor\": \"remote\", \"endpoint\": \"http://127.0.0.1:$MODEL_PORT/edit\"}]"
source scripts/stack-lib.sh
trap stack_kill EXIT
stack_start || { echo "console-check: the stack did not start"; exit 1; }

shots=${CONSOLE_SCREENSHOTS:-$DIR/screenshots}
python3 scripts/console-check.py --url "http://127.0.0.1:$GATEWAY_PORT" --admin-token "$ADMIN_TOKEN" --viewer-token "$VIEWER_TOKEN" \
  --model-port "$MODEL_PORT" --screenshots "$shots"
status=$?
if [ $status -ne 0 ]; then
  echo "console-check: the stack's last lines:"
  tail -40 "$DIR/stack.log"
  exit 1
fi
for secret in "$ADMIN_TOKEN" "$VIEWER_TOKEN" "sig=" "X-Amz-Signature"; do
  if grep -aqF -- "$secret" "$DIR/stack.log"; then
    echo "console-check: FAILED: the stack's log holds '$secret':"
    grep -aF -- "$secret" "$DIR/stack.log" | head -5
    exit 1
  fi
done
echo "console-check: passed (no token or signed link in the stack's log)"
