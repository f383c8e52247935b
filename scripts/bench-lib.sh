# Shared by the bench scripts (sourced): release builds, free ports, a scratch folder and the
# background processes, all cleaned up on exit.

# Builds each named product for release, quietly unless it fails; sets BIN.
build_release() {
  for product in "$@"; do
    swift build -c release --product "$product" >/dev/null 2>&1 || swift build -c release --product "$product"
  done
  BIN=$(swift build -c release --show-bin-path)
}

# A TCP port on loopback that nothing listens on right now.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Installs Debian's PACKAGE unless COMMAND is on the PATH.
need() {
  command -v "$1" >/dev/null && return 0
  echo "installing $2"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
}

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
