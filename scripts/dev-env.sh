# Sourced by run.sh and loadtest.sh: the development secrets `make run` uses when none are set,
# so that `make loadtest` can sign users' tokens and read usage on the stack `make run` started.
# With DEV_ENV_QUIET=1 nothing is printed.
say() { [ "${DEV_ENV_QUIET:-0}" = 1 ] || echo "$@"; }
export DATA_DIR=${DATA_DIR:-.data}
export GATEWAY_PORT=${GATEWAY_PORT:-8080}
# Exports VARIABLE=VALUE unless VARIABLE is set, and then says MESSAGE.
default() {
  [ -n "${!1:-}" ] && return 0
  export "$1=$2"
  say "[run] $1 not set: $3"
}
default JWT_SECRET "development-jwt-secret-not-for-production-use" "using the development secret 'development-jwt-secret-not-for-production-use'"
default URL_SIGNING_SECRET "development-url-signing-secret" "using the development secret"
default ADAPTY_WEBHOOK_SECRET "development-adapty-webhook-secret" "POST /webhooks/adapty takes 'Authorization: development-adapty-webhook-secret'"
default ADMIN_TOKEN "development-admin-token" "using the development token 'development-admin-token'"
export PUBLIC_BASE_URL=${PUBLIC_BASE_URL:-http://127.0.0.1:$GATEWAY_PORT}
