# Sourced by run.sh and loadtest.sh: the development secrets `make run` uses when none are set,
# so that `make loadtest` can sign users' tokens and read usage on the stack `make run` started.
# With DEV_ENV_QUIET=1 nothing is printed.
say() { [ "${DEV_ENV_QUIET:-0}" = 1 ] || echo "$@"; }
export DATA_DIR=${DATA_DIR:-.data}
export GATEWAY_PORT=${GATEWAY_PORT:-8080}
if [ -z "${JWT_SECRET:-}" ]; then
  export JWT_SECRET="development-jwt-secret-not-for-production-use"
  say "[run] JWT_SECRET not set: using the development secret '$JWT_SECRET'"
fi
if [ -z "${URL_SIGNING_SECRET:-}" ]; then
  export URL_SIGNING_SECRET="development-url-signing-secret"
  say "[run] URL_SIGNING_SECRET not set: using the development secret"
fi
if [ -z "${ADAPTY_WEBHOOK_SECRET:-}" ]; then
  export ADAPTY_WEBHOOK_SECRET="development-adapty-webhook-secret"
  say "[run] ADAPTY_WEBHOOK_SECRET not set: POST /webhooks/adapty takes 'Authorization: $ADAPTY_WEBHOOK_SECRET'"
fi
if [ -z "${ADMIN_TOKEN:-}" ]; then
  export ADMIN_TOKEN="development-admin-token"
  say "[run] ADMIN_TOKEN not set: using the development token '$ADMIN_TOKEN'"
fi
export PUBLIC_BASE_URL=${PUBLIC_BASE_URL:-http://127.0.0.1:$GATEWAY_PORT}
