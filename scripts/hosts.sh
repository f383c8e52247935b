#!/usr/bin/env bash
# The whole system spread over hosts, on this machine: each host a network namespace of its own,
# joined to the others by a bridge (a private test network, 10.197.N.0/24, that exists only inside
# this machine), and a mount namespace of its own in which every other host's folder is hidden.
# What scripts/hosts-chaos.sh crashes and partitions. Needs root (namespaces, nftables).
#
#   hosts.sh up DIR               lay out the hosts and start everything (DIR: a new folder);
#                                 writes DIR/root/loadtest.env (the edge's URL, the tokens)
#   hosts.sh down DIR             stop every process of every host, remove the network
#   hosts.sh crash DIR HOST       kill every process of HOST at once (SIGKILL), as a power cut
#   hosts.sh boot DIR HOST        start HOST's processes again, as at its start
#   hosts.sh partition DIR HOST [PEER...]
#                                 cut HOST off: with no PEER, its link goes down (its processes
#                                 run on, reaching nothing); with PEERs, it and they drop each
#                                 other's packets (nftables in HOST), its other links stay up
#   hosts.sh heal DIR HOST        undo HOST's partition
#   hosts.sh leader DIR           the service host whose jobs replica leads dispatch
#   hosts.sh exec DIR HOST CMD... run CMD in HOST (its namespaces)
#   hosts.sh status DIR           each host's address and live processes
#
# The topology (host: address .N of the network; what runs there):
#   root (.1)       this machine's own namespace: the load test, and the provider fixture (the
#                   model providers "on the internet", in their documented shapes)
#   edge (.2)       HAProxy (Debian's) on :8080 in front of both gateways, /readyz checks
#   gw1, gw2        a gateway each, on :8080
#   svc1, svc2      one replica each of quota (:7101), history (:7102) and jobs (:7103; workers
#   (.21, .22)      :7104), all on PostgreSQL
#   db (.31)        PostgreSQL 15 on :5432
#   s3 (.32)        Ceph's RADOS Gateway on :7480
#   wk1, wk2        a worker each (capacity 2; videos at fal go to wk1 only)
# The bus runs with CURVE between hosts; each host holds only its own roles' keys
# (`photoedit keys --role`), as the README's "Keys across hosts" says. Each host's processes run
# under a small init (this script's `init`) that restarts a process that exits; a crash kills the
# init too, and `boot` starts it again. Logs: DIR/HOST/log/PROCESS.log.
# The edge passes the client's address (X-Forwarded-For, the gateways trust the edge); every
# virtual user of a load test comes from one address, the root namespace's, so the guests' limits
# per client network (QUOTA_GUESTS_PER_NETWORK_HOUR, QUOTA_GUEST_NETWORK_DAILY) are lifted here.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

die() { echo "hosts: $*" >&2; exit 1; }
HOSTS="edge gw1 gw2 svc1 svc2 db s3 wk1 wk2"
number_of() {
  case $1 in
    root) echo 1 ;; edge) echo 2 ;; gw1) echo 11 ;; gw2) echo 12 ;; svc1) echo 21 ;; svc2) echo 22 ;;
    db) echo 31 ;; s3) echo 32 ;; wk1) echo 41 ;; wk2) echo 42 ;; *) die "no host $1 (hosts: $HOSTS)" ;;
  esac
}

# The network's index N (10.197.N.0/24), kept in DIR/network.
load() {
  DIR=$(cd "$1" 2>/dev/null && pwd) || die "no folder $1"
  [ -f "$DIR/network" ] || die "$DIR is not a folder hosts.sh up laid out"
  NET=$(cat "$DIR/network")
  BIN=$(cat "$DIR/bin")
}
addr() { echo "10.197.$NET.$(number_of "$1")"; }
ns() { echo "pe$NET-$1"; }
link() { echo "pe${NET}-$1"; }
bridge() { echo "pe${NET}br"; }

# Runs a command in HOST's network namespace (not its mount namespace: for the network's own set-up).
in_ns() { local host=$1; shift; ip netns exec "$(ns "$host")" "$@"; }

# Starts HOST's init in its namespaces, in the background, its output in DIR/HOST/log/init.log.
boot() {
  local host=$1
  mkdir -p "$DIR/$host/log" "$DIR/$host/pids"
  rm -f "$DIR/$host/stopping"
  setsid ip netns exec "$(ns "$host")" unshare --mount --propagation private \
    bash "$REPO/scripts/hosts.sh" init "$DIR" "$host" >> "$DIR/$host/log/init.log" 2>&1 < /dev/null &
}

# Every process in HOST's network namespace.
pids_of() { ip netns pids "$(ns "$1")" 2>/dev/null; }

crash() {
  local host=$1 pids
  for _ in 1 2 3 4 5; do
    pids=$(pids_of "$host")
    [ -z "$pids" ] && return 0
    kill -KILL $pids 2>/dev/null
    sleep 0.2
  done
  [ -z "$(pids_of "$host")" ] || die "$host: processes left after SIGKILL: $(pids_of "$host")"
}

wait_for() {  # SECONDS WHAT COMMAND...
  local seconds=$1 what=$2; shift 2
  local end=$((SECONDS + seconds))
  while [ $SECONDS -lt $end ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.3; done
  die "$what did not come up within $seconds s"
}
port_open() { timeout 1 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

# Writes FILE from NAME=VALUE arguments, each value quoted for the shell (`source` reads it back).
write_env() {
  local file=$1 setting; shift
  : > "$file"; chmod 600 "$file"
  for setting in "$@"; do printf '%s=%q\n' "${setting%%=*}" "${setting#*=}" >> "$file"; done
}

up() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network and mount namespaces)"
  if ! command -v haproxy >/dev/null || ! command -v nft >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq haproxy nftables >/dev/null || die "could not install haproxy and nftables"
  fi
  scripts/postgres-server.sh install >/dev/null || die "could not install PostgreSQL"
  scripts/s3-server.sh install >/dev/null || die "could not install the RADOS Gateway"
  mkdir -p "$1"
  DIR=$(cd "$1" && pwd)
  # PostgreSQL runs as its own user, which must reach the db host's folder.
  chmod 755 "$DIR"
  BIN=${HOSTS_BIN:-$(scripts/swift-build.sh --show-bin-path)}
  [ -x "$BIN/gateway" ] && [ -x "$BIN/provider-fixture" ] || die "no build in $BIN (scripts/swift-build.sh --build-tests)"
  echo "$BIN" > "$DIR/bin"
  local n
  for n in $(seq 1 250); do
    ip link show "pe${n}br" >/dev/null 2>&1 && continue
    ip link add "pe${n}br" type bridge 2>/dev/null || continue
    NET=$n
    break
  done
  [ -n "${NET:-}" ] || die "no free network index"
  echo "$NET" > "$DIR/network"
  ip addr add "$(addr root)/24" dev "$(bridge)"
  ip link set "$(bridge)" up
  local host inner
  for host in $HOSTS; do
    inner="pe${NET}i$(number_of "$host")"
    ip netns add "$(ns "$host")" || die "ip netns add $(ns "$host") failed"
    ip link add "$(link "$host")" type veth peer name "$inner" || die "veth for $host failed"
    ip link set "$inner" netns "$(ns "$host")"
    ip link set "$(link "$host")" master "$(bridge)"
    ip link set "$(link "$host")" up
    in_ns "$host" ip link set "$inner" name eth0
    in_ns "$host" ip addr add "$(addr "$host")/24" dev eth0
    in_ns "$host" ip link set eth0 up
    in_ns "$host" ip link set lo up
    mkdir -p "$DIR/$host/log" "$DIR/$host/pids" "$DIR/$host/tmp"
  done
  mkdir -p "$DIR/root" "$DIR/deploy"

  # The deployment's secrets and keys (DIR/deploy, seen by no host), and each host's share.
  secret() { head -c 24 /dev/urandom | base64 | tr -d '/+='; }
  write_env "$DIR/deploy/secrets.env" "JWT_SECRET=$(secret)$(secret)" "URL_SIGNING_SECRET=$(secret)" \
    "ADAPTY_WEBHOOK_SECRET=$(secret)" "ADMIN_TOKEN=$(secret)"
  "$BIN/photoedit" keys --output "$DIR/deploy/bus-keys.env" >/dev/null || die "photoedit keys failed"
  local role
  for host in gw1 gw2; do "$BIN/photoedit" keys --from "$DIR/deploy/bus-keys.env" --role gateway --output "$DIR/$host/gateway-keys.env" >/dev/null; done
  for host in svc1 svc2; do
    for role in quota history jobs; do
      "$BIN/photoedit" keys --from "$DIR/deploy/bus-keys.env" --role "$role" --output "$DIR/$host/$role-keys.env" >/dev/null
    done
  done
  for host in wk1 wk2; do "$BIN/photoedit" keys --from "$DIR/deploy/bus-keys.env" --role worker --output "$DIR/$host/worker-keys.env" >/dev/null; done

  # The providers "on the internet": the fixture, in the root namespace, on the bridge's address.
  local fixture_port
  fixture_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  FIXTURE_HOST=$(addr root) FIXTURE_PORT=$fixture_port FIXTURE_VIDEO_MS=${HOSTS_VIDEO_MS:-8000} \
    setsid "$BIN/provider-fixture" > "$DIR/root/provider-fixture.log" 2>&1 < /dev/null &
  echo $! > "$DIR/root/provider-fixture.pid"
  local fixture="http://$(addr root):$fixture_port"
  echo "$fixture" > "$DIR/root/fixture.url"
  local effects="[{\"id\": \"nano-banana\", \"title\": \"Nano Banana\", \"processor\": \"gemini\", \"model\": \"gemini-2.5-flash-image\", \"credits\": 2, \"endpoint\": \"$fixture\"}, {\"id\": \"veo\", \"title\": \"FalAI Veo 3.1\", \"processor\": \"fal\", \"model\": \"fal-ai/veo3.1/image-to-video\", \"kind\": \"video\", \"credits\": 4, \"endpoint\": \"$fixture\"}]"

  # db and s3 first: the services need them.
  boot db
  boot s3
  wait_for 120 "PostgreSQL on db" test -s "$DIR/db/postgres/postgres.env"
  wait_for 30 "PostgreSQL on db:5432" port_open "$(addr db)" 5432
  wait_for 240 "the RADOS Gateway on s3" test -s "$DIR/s3/rgw/s3.env"
  local password
  password=$(sed -n 's|^POSTGRES_URL=postgres://photoedit:\([^@]*\)@.*|\1|p' "$DIR/db/postgres/postgres.env")
  local database="postgres://photoedit:$password@$(addr db):5432/photoedit"
  local s3_settings=() line
  while IFS= read -r line; do
    case $line in
      export\ S3_ENDPOINT=*) s3_settings+=("S3_ENDPOINT=http://$(addr s3):7480") ;;
      export\ *) s3_settings+=("${line#export }") ;;
    esac
  done < "$DIR/s3/rgw/s3.env"
  local list_quota="" list_history="" list_jobs="" list_workers=""
  for host in svc1 svc2; do
    list_quota+="${list_quota:+,}tcp://$(addr "$host"):7101"
    list_history+="${list_history:+,}tcp://$(addr "$host"):7102"
    list_jobs+="${list_jobs:+,}tcp://$(addr "$host"):7103"
    list_workers+="${list_workers:+,}tcp://$(addr "$host"):7104"
  done
  local public="http://$(addr edge):8080" common
  common=("LOG_LEVEL=${LOG_LEVEL:-info}" "QUOTA_ENDPOINT=$list_quota" "HISTORY_ENDPOINT=$list_history" "JOBS_ENDPOINT=$list_jobs"
          "${s3_settings[@]}" "PUBLIC_BASE_URL=$public")
  for host in svc1 svc2; do
    local a; a=$(addr "$host")
    write_env "$DIR/$host/host.env" "${common[@]}" "$(grep ^URL_SIGNING_SECRET= "$DIR/deploy/secrets.env")" \
      "QUOTA_BIND=tcp://$a:7101" "HISTORY_BIND=tcp://$a:7102" "JOBS_BIND=tcp://$a:7103" "JOBS_WORKER_BIND=tcp://$a:7104" \
      "QUOTA_DATABASE_URL=$database" "HISTORY_DATABASE_URL=$database" "JOBS_DATABASE_URL=$database" \
      "JOBS_EFFECTS=$effects" "QUOTA_STALE_AFTER_S=${QUOTA_STALE_AFTER_S:-10}" "QUOTA_STALE_SCAN_MS=1000" \
      "QUOTA_GUESTS_PER_NETWORK_HOUR=1000000" "QUOTA_GUEST_NETWORK_DAILY=0" \
      "DATA_DIR=$DIR/$host/data"
  done
  for host in gw1 gw2; do
    write_env "$DIR/$host/host.env" "${common[@]}" $(cat "$DIR/deploy/secrets.env") \
      "GATEWAY_HOST=$(addr "$host")" "GATEWAY_PORT=8080" "FAL_WEBHOOK_JWKS_URL=$fixture/.well-known/jwks.json" "TRUSTED_PROXIES=$(addr edge)/32" "DATA_DIR=$DIR/$host/data"
  done
  # Videos (veo, at fal) go to wk1 only, so that a partition of wk1 surely cuts off the worker
  # holding a generation at the provider (scripts/hosts-chaos.sh waits for one first).
  local effects_of
  for host in wk1 wk2; do
    effects_of="*"
    [ "$host" = wk2 ] && effects_of="copy,grayscale,blur,sharpen,upscale,auto-enhance,nano-banana"
    write_env "$DIR/$host/host.env" "LOG_LEVEL=${LOG_LEVEL:-info}" "JOBS_WORKER_ENDPOINT=$list_workers" "WORKER_ID=$host" "WORKER_EFFECTS=$effects_of" \
      "WORKER_CAPACITY=2" "GEMINI_API_KEY=test-gemini-key" "OPENAI_API_KEY=test-openai-key" "FAL_KEY=test-fal-key" \
      "DATA_DIR=$DIR/$host/data" "TMPDIR=$DIR/$host/tmp"
  done
  # The edge runs deploy/hosts/haproxy.cfg itself, given the gateways as edge-host.yaml gives them.
  cp "$REPO/deploy/hosts/haproxy.cfg" "$DIR/edge/haproxy.cfg"
  write_env "$DIR/edge/host.env" "GATEWAY_1=$(addr gw1):8080" "GATEWAY_2=$(addr gw2):8080"
  for host in svc1 svc2; do boot "$host"; done
  for host in gw1 gw2 wk1 wk2 edge; do boot "$host"; done
  # Each gateway ready (its services reached), then the edge: the edge's first 200 could come from
  # one gateway while the other was not ready yet, and a load test started then was answered 503
  # at its own readiness check (CI, 2026-12-07, crash-leader-host).
  for host in gw1 gw2; do wait_for 180 "$host's /readyz" curl -fsS "http://$(addr "$host"):8080/readyz"; done
  wait_for 180 "the edge's /readyz" curl -fsS "$public/readyz"
  write_env "$DIR/root/loadtest.env" "LOADTEST_TARGET=$public" $(grep -E '^(JWT_SECRET|ADMIN_TOKEN)=' "$DIR/deploy/secrets.env")
  echo "hosts: up in $DIR (network 10.197.$NET.0/24; edge $public)"
}

# Inside HOST (its namespaces, started by `boot`): hides every other host's folder, then runs
# HOST's processes, each restarted 1 s after it exits, until SIGTERM.
init() {
  local host=$1 other
  for other in $HOSTS root deploy; do
    [ "$other" = "$host" ] || mount -t tmpfs -o size=1m,mode=755 tmpfs "$DIR/$other" || die "$host: could not hide $DIR/$other"
  done
  local hdir="$DIR/$host" children=()
  trap 'touch "$hdir/stopping"; kill -TERM "${children[@]}" 2>/dev/null; wait; exit 0' TERM INT
  # Runs the command after NAME, its output in log/NAME.log, again 1 s after it exits.
  supervise() {
    local name=$1; shift
    local child=0
    trap 'kill -TERM "$child" 2>/dev/null; exit 0' TERM
    while [ ! -e "$hdir/stopping" ]; do
      "$@" >> "$hdir/log/$name.log" 2>&1 &
      child=$!
      echo "$child" > "$hdir/pids/$name.pid"
      wait "$child"
      echo "[init] $name exited with status $?; restarting in 1 s" >> "$hdir/log/$name.log"
      sleep 1
    done
  }
  # Runs the program BIN/NAME with host.env and the role's keys file in its environment.
  service() { exec bash -c 'set -a; source "$1"; [ -f "$2" ] && source "$2"; set +a; exec "$3"' _ "$hdir/host.env" "$hdir/$1-keys.env" "$BIN/$1"; }
  case $host in
    db)
      POSTGRES_BIND="$(addr db),127.0.0.1" POSTGRES_HBA_NETWORK="10.197.$NET.0/24" \
        "$REPO/scripts/postgres-server.sh" start "$hdir/postgres" 5432 > /dev/null || die "PostgreSQL did not start"
      # Restarted if it dies (a crash of the host kills it with the rest).
      while [ ! -e "$hdir/stopping" ]; do
        pid=$(head -1 "$hdir/postgres/data/postmaster.pid" 2>/dev/null)
        if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != postgres ]; then
          POSTGRES_BIND="$(addr db),127.0.0.1" "$REPO/scripts/postgres-server.sh" start "$hdir/postgres" 5432 > /dev/null 2>&1
        fi
        sleep 1 & wait $!
      done ;;
    s3)
      S3_BIND=0.0.0.0 "$REPO/scripts/s3-server.sh" start "$hdir/rgw" 7480 > "$hdir/log/s3-server.log" 2>&1 || die "the RADOS Gateway did not start"
      while [ ! -e "$hdir/stopping" ]; do
        pid=$(cat "$hdir/rgw/run/rgw.pid" 2>/dev/null)
        if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != radosgw ]; then
          "$REPO/scripts/s3-server.sh" rgw "$hdir/rgw" >> "$hdir/log/s3-server.log" 2>&1
        fi
        sleep 1 & wait $!
      done ;;
    edge)
      supervise haproxy bash -c 'set -a; source "$1"; set +a; exec haproxy -db -f "$2"' _ "$hdir/host.env" "$hdir/haproxy.cfg" & children+=($!) ;;
    gw1|gw2)
      supervise gateway service gateway & children+=($!) ;;
    svc1|svc2)
      local role
      for role in quota history jobs; do supervise "$role" service "$role" & children+=($!); done ;;
    wk1|wk2)
      supervise worker service worker & children+=($!) ;;
  esac
  wait
}

down() {
  local host
  for host in $HOSTS; do [ -d "$DIR/$host" ] && touch "$DIR/$host/stopping"; done
  # Gracefully first (the stores' own stop), then whatever is left, host by host.
  [ -f "$DIR/s3/rgw/ceph.conf" ] && in_ns s3 "$REPO/scripts/s3-server.sh" stop "$DIR/s3/rgw" >/dev/null 2>&1
  [ -d "$DIR/db/postgres" ] && in_ns db "$REPO/scripts/postgres-server.sh" stop "$DIR/db/postgres" >/dev/null 2>&1
  for host in $HOSTS; do
    local pids; pids=$(pids_of "$host")
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null
  done
  for _ in $(seq 1 50); do
    local left=""
    for host in $HOSTS; do left+=$(pids_of "$host"); done
    [ -z "$left" ] && break
    sleep 0.2
  done
  for host in $HOSTS; do crash "$host" 2>/dev/null; ip netns del "$(ns "$host")" 2>/dev/null; done
  [ -f "$DIR/root/provider-fixture.pid" ] && kill -TERM "$(cat "$DIR/root/provider-fixture.pid")" 2>/dev/null
  ip link del "$(bridge)" 2>/dev/null
  echo "hosts: down ($DIR)"
}

partition() {
  local host=$1; shift
  if [ $# -eq 0 ]; then
    ip link set "$(link "$host")" down
    return
  fi
  local peers="" peer
  for peer in "$@"; do peers+="${peers:+, }$(addr "$peer")"; done
  in_ns "$host" nft -f - <<EOF || die "nft in $host failed"
table inet pe_partition {
  set peers { type ipv4_addr; elements = { $peers } }
  chain input { type filter hook input priority 0; ip saddr @peers drop; }
  chain output { type filter hook output priority 0; ip daddr @peers drop; }
}
EOF
}

heal() {
  local host=$1
  ip link set "$(link "$host")" up
  in_ns "$host" nft delete table inet pe_partition 2>/dev/null
  return 0
}

leader() {
  local holder host
  holder=$(in_ns db "$REPO/scripts/postgres-server.sh" query "$DIR/db/postgres" \
    "SELECT holder FROM jobs_leader WHERE name = 'dispatcher' AND expires_at > now()" 2>/dev/null)
  [ -n "$holder" ] || die "no jobs replica leads"
  for host in svc1 svc2; do
    grep -q "holder=$holder" "$DIR/$host/log/jobs.log" 2>/dev/null && { echo "$host"; return 0; }
  done
  die "no host logged leading as $holder"
}

status() {
  local host
  for host in root $HOSTS; do
    if [ "$host" = root ]; then echo "root $(addr root)"; continue; fi
    echo "$host $(addr "$host"): $(pids_of "$host" | xargs -r ps -o comm= -p | sort | uniq -c | awk '{ printf "%s×%s ", $2, $1 }')"
  done
}

command=${1:-}
[ -n "$command" ] && [ -n "${2:-}" ] || die "usage: $0 up|down|crash|boot|partition|heal|leader|exec|status DIR [HOST ...]"
case $command in
  up) up "$2" ;;
  down) load "$2"; down ;;
  init) load "$2"; init "$3" ;;
  crash) load "$2"; number_of "$3" >/dev/null; crash "$3" ;;
  boot) load "$2"; number_of "$3" >/dev/null; boot "$3" ;;
  partition) load "$2"; shift 2; partition "$@" ;;
  heal) load "$2"; heal "$3" ;;
  leader) load "$2"; leader ;;
  exec) load "$2"; host=$3; shift 3; ip netns exec "$(ns "$host")" "$@" ;;
  status) load "$2"; status ;;
  *) die "unknown command $command" ;;
esac
