#!/usr/bin/env bash
# A local S3-compatible store: Ceph's RADOS Gateway (Debian's radosgw) on a one-node cluster
# (one monitor, one memstore OSD, no cephx) kept in a folder, answering S3 on 127.0.0.1:PORT.
# What `BLOB_STORE=s3 make run` and the tests run against.
#
#   s3-server.sh install            the Debian packages (root; about 75 MB)
#   s3-server.sh start DIR PORT     start (a new cluster if DIR is new), create $S3_BUCKET
#                                   (default photoedit), listen on $S3_BIND (default 127.0.0.1);
#                                   writes DIR/s3.env, prints it
#   s3-server.sh stop DIR           stop what was started for DIR
#   s3-server.sh rgw DIR            start radosgw again for DIR (after it died), wait until it answers
#
# Why each setting (found on this machine kind; see also shared/s3 in the steering repo):
# - no cephx, but monitors still need `ms mon client mode = crc secure` or radosgw waits for
#   ever at start;
# - pools made up front in one `ceph` session (radosgw alone makes them one by one, ~8 s);
# - memstore keeps objects in the OSD's memory and saves them on a clean stop
#   (`osd fast shutdown = false`); a SIGKILL of the OSD loses them;
# - radosgw may hang on SIGTERM: `rgw exit timeout secs` bounds it; a stopped daemon is a zombie
#   for a while: wait on /proc/PID/status, not kill -0;
# - the monitor stops below 5% free disk by default: the thresholds are lowered.
set -euo pipefail

die() { echo "s3-server: $*" >&2; exit 1; }
daemon_of() { case $1 in mon) echo ceph-mon;; osd) echo ceph-osd;; rgw) echo radosgw;; esac; }
running() {  # pid name: the pid runs that daemon and is not a zombie
    local comm; comm=$(cat "/proc/$1/comm" 2>/dev/null) || return 1
    [[ $comm == "$(daemon_of "$2")"* ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

stop_all() {
    local dir=$1 name pid
    for name in rgw osd mon; do
        [ -f "$dir/run/$name.pid" ] || continue
        pid=$(cat "$dir/run/$name.pid")
        if running "$pid" "$name"; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 100); do running "$pid" "$name" || break; sleep 0.1; done
            running "$pid" "$name" && kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/run/$name.pid"
    done
}

case "${1:-}" in
install)
    command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null && command -v ceph >/dev/null && exit 0
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends radosgw ceph-mon ceph-osd ceph-common curl >/dev/null
    exit 0 ;;
stop)
    [ -n "${2:-}" ] && [ -d "$2" ] || die "usage: $0 stop DIR"
    stop_all "$(cd "$2" && pwd)"
    exit 0 ;;
start)
    [ $# -eq 3 ] || die "usage: $0 start DIR PORT" ;;
rgw)
    [ -n "${2:-}" ] && [ -f "$2/ceph.conf" ] || die "usage: $0 rgw DIR (a folder s3-server.sh started)"
    DIR=$(cd "$2" && pwd)
    export CEPH_CONF=$DIR/ceph.conf
    PORT=$(sed -n 's/^rgw frontends = beast endpoint=.*:\([0-9]*\)$/\1/p' "$DIR/ceph.conf")
    nohup setsid radosgw -n client.rgw -f -c "$CEPH_CONF" >"$DIR/log/rgw.out" 2>&1 </dev/null &
    echo $! >"$DIR/run/rgw.pid"
    for _ in $(seq 1 300); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/" && exit 0; sleep 0.1; done
    die "radosgw did not answer on $PORT" ;;
*)
    die "usage: $0 install | start DIR PORT | stop DIR | rgw DIR" ;;
esac

command -v radosgw >/dev/null || die "radosgw is not installed: run $0 install"
mkdir -p "$2"
DIR=$(cd "$2" && pwd)
PORT=$3
MON_PORT=${S3_MON_PORT:-$((PORT + 1))}
BUCKET=${S3_BUCKET:-photoedit}
# Where radosgw listens: loopback by default; the two-host tests use 0.0.0.0 so that a worker in a
# network namespace of theirs reaches it over its veth pair.
BIND=${S3_BIND:-127.0.0.1}
export CEPH_CONF=$DIR/ceph.conf

# Each daemon in a session of its own (setsid: the pid stays the command's), as pg_ctl starts
# PostgreSQL: a Ctrl-C at the terminal of `make run` reaches the services, not the store under them,
# which run.sh stops after them (`stop`). Each is given its ceph.conf on its command line too
# (CEPH_CONF says the same), so that a process of DIR's is known by its command line.
launch() {  # name command...
    local name=$1; shift
    nohup setsid "$@" >"$DIR/log/$name.out" 2>&1 </dev/null &
    echo $! >"$DIR/run/$name.pid"
}
wait_until() {  # seconds what command...
    local seconds=$1 what=$2 name; shift 2
    for _ in $(seq 1 $((seconds * 10))); do
        "$@" >/dev/null 2>&1 && return 0
        for name in mon osd rgw; do
            if [ -f "$DIR/run/$name.pid" ] && ! running "$(cat "$DIR/run/$name.pid")" "$name"; then
                # Its last words, before the folder (and its logs) may go with the caller's cleanup.
                tail -n 8 "$DIR/log/$name.out" "$DIR/log/client.$name.log" "$DIR/log/$name.a.log" "$DIR/log/$name.0.log" 2>/dev/null >&2
                die "$name exited while waiting for $what (logs in $DIR/log)"
            fi
        done
        sleep 0.1
    done
    die "no $what after ${seconds}s (logs in $DIR/log)"
}

FRESH=0
if [ ! -f "$DIR/ceph.conf" ]; then
    FRESH=1
    mkdir -p "$DIR/run" "$DIR/log" "$DIR/mon.a" "$DIR/osd.0" "$DIR/rgw"
    random() { head -c 4096 /dev/urandom | LC_ALL=C tr -dc "$1" | head -c "$2"; }
    ACCESS=${AWS_ACCESS_KEY_ID:-$(random 'A-Z0-9' 20)}
    SECRET=${AWS_SECRET_ACCESS_KEY:-$(random 'A-Za-z0-9' 40)}
    printf '%s\n%s\n' "$ACCESS" "$SECRET" >"$DIR/keys"
    chmod 600 "$DIR/keys"
    FSID=$(cat /proc/sys/kernel/random/uuid)
    cat >"$DIR/ceph.conf" <<CONF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
mon data = $DIR/mon.\$id
osd data = $DIR/osd.\$id
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1
paxos propose interval = 0.05
paxos min wait = 0.01
[osd]
osd objectstore = memstore
memstore device bytes = $(( ${S3_MEMORY_GB:-4} << 30 ))
osd memory target = 1073741824
osd fast shutdown = false
[client.rgw]
rgw frontends = beast endpoint=$BIND:$PORT
rgw data = $DIR/rgw
rgw thread pool size = 64
rgw exit timeout secs = 5
rgw gc obj min wait = 60
rgw gc processor period = 60
CONF
    monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_PORT]" "$DIR/monmap" >/dev/null
    ceph-mon --mkfs -i a --monmap "$DIR/monmap" >"$DIR/log/mon-mkfs.out" 2>&1 || die "ceph-mon --mkfs failed (see $DIR/log)"
fi
{ read -r ACCESS; read -r SECRET; } <"$DIR/keys"
trap 'status=$?; [ $status -ne 0 ] && stop_all "$DIR"; exit $status' EXIT

for name in mon osd rgw; do
    if [ -f "$DIR/run/$name.pid" ] && running "$(cat "$DIR/run/$name.pid")" "$name"; then die "$name already runs for $DIR"; fi
done
launch mon ceph-mon -i a -f -c "$CEPH_CONF"
wait_until 30 "monitor" timeout 5 ceph mon stat
if [ $FRESH = 1 ]; then
    OSD_UUID=$(cat /proc/sys/kernel/random/uuid)
    [ "$(timeout 30 ceph osd new "$OSD_UUID")" = 0 ] || die "ceph osd new did not give osd.0"
    ceph-osd -i 0 --mkfs --osd-uuid "$OSD_UUID" >"$DIR/log/osd-mkfs.out" 2>&1 || die "ceph-osd --mkfs failed (see $DIR/log)"
fi
launch osd ceph-osd -i 0 -f -c "$CEPH_CONF"
wait_until 60 "osd.0 up" sh -c 'timeout 5 ceph osd dump --format=json | grep -q "\"up\":1"'
if [ $FRESH = 1 ]; then
    for pool in .rgw.root default.rgw.log default.rgw.control default.rgw.meta default.rgw.buckets.index default.rgw.buckets.data default.rgw.buckets.non-ec; do
        echo "osd pool create $pool 8"; echo "osd pool application enable $pool rgw"
    done | timeout 60 ceph >"$DIR/log/pools.out" 2>&1 || die "pool creation failed (see $DIR/log/pools.out)"
fi
launch rgw radosgw -n client.rgw -f -c "$CEPH_CONF"
wait_until 120 "radosgw on port $PORT" curl -sf -o /dev/null "http://127.0.0.1:$PORT/"
if [ $FRESH = 1 ]; then
    timeout 60 radosgw-admin user create --uid=photoedit --display-name=photoedit --access-key="$ACCESS" --secret-key="$SECRET" \
        >"$DIR/log/user.out" 2>&1 || die "radosgw-admin user create failed (see $DIR/log/user.out)"
fi
SIGN=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$ACCESS:$SECRET" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
# The bucket (an existing one of ours answers 200 or 409 BucketAlreadyOwnedByYou).
wait_until 30 "bucket $BUCKET" sh -c "code=\$(curl -s -o /dev/null -w '%{http_code}' $(printf '%q ' "${SIGN[@]}") -X PUT http://127.0.0.1:$PORT/$BUCKET); [ \$code = 200 ] || [ \$code = 409 ]"
cat >"$DIR/s3.env" <<ENV
export BLOB_STORE=s3
export S3_ENDPOINT=http://127.0.0.1:$PORT
export S3_REGION=us-east-1
export S3_BUCKET=$BUCKET
export S3_ADDRESSING=path
export AWS_ACCESS_KEY_ID=$ACCESS
export AWS_SECRET_ACCESS_KEY=$SECRET
ENV
chmod 600 "$DIR/s3.env"
echo "s3-server: radosgw at http://127.0.0.1:$PORT, bucket $BUCKET (settings in $DIR/s3.env; stop: $0 stop $DIR)"
