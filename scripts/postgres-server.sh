#!/usr/bin/env bash
# A local PostgreSQL 15 (Debian's package) kept in a folder, answering on 127.0.0.1:PORT with
# password authentication. What `STORE=postgres make run` and the tests run against.
#
#   postgres-server.sh install          the Debian packages (root)
#   postgres-server.sh start DIR PORT   start (initdb first if DIR is new: a `photoedit` role with
#                                       a random password that may create databases, as the
#                                       tests do, and a `photoedit` database it owns);
#                                       writes DIR/postgres.env (POSTGRES_URL=...), prints it
#   postgres-server.sh stop DIR         stop what was started for DIR (fast shutdown)
#   postgres-server.sh query DIR SQL    runs SQL as the superuser in the photoedit database, prints
#                                       the rows unaligned (what the benchmarks read counts with)
#
# PostgreSQL will not run as root: as root, the server runs as the `postgres` user the package
# made, and DIR is handed to it. fsync stays on (the chaos checks kill it and count what it kept),
# except with POSTGRES_THROWAWAY=1, what `scripts/with-postgres.sh` (the tests' server) sets:
# fsync, synchronous_commit and full_page_writes off, and initdb without its closing flush, as a
# server whose data is thrown away after the run may have them (databases made and migrated by the
# hundred cost no flushes). The services' own PostgreSQL and `make run`'s never take it.
set -euo pipefail

die() { echo "postgres-server: $*" >&2; exit 1; }
bin() {
    local dir
    for dir in /usr/lib/postgresql/*/bin; do [ -x "$dir/postgres" ] && { echo "$dir"; return; }; done
    die "no PostgreSQL server installed: run $0 install"
}
as_owner() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
# Where the server's files are: DIR, or the folder DIR/server links to (see "start").
home_of() { if [ -L "$1/server" ]; then readlink -f "$1/server"; else echo "$1"; fi; }

case "${1:-}" in
install)
    ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && exit 0
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    # The server without the cluster Debian would make and start for itself.
    $sudo mkdir -p /etc/postgresql-common && echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.conf >/dev/null
    $sudo apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    exit 0 ;;
stop)
    [ -n "${2:-}" ] && [ -d "$2/data" ] || die "usage: $0 stop DIR"
    dir=$(cd "$2" && pwd)
    as_owner "$(bin)/pg_ctl" -D "$(home_of "$dir")/data" -m fast -w stop >/dev/null 2>&1 || true
    exit 0 ;;
query)
    [ $# -eq 3 ] && [ -f "$2/postgres.env" ] || die "usage: $0 query DIR SQL (of a started server)"
    dir=$(cd "$2" && pwd)
    port=$(sed -n 's/^POSTGRES_URL=.*:\([0-9]*\)\/photoedit$/\1/p' "$dir/postgres.env")
    as_owner "$(bin)/psql" -h "$(home_of "$dir")" -p "$port" -U postgres -d photoedit -qAt -v ON_ERROR_STOP=1 -c "$3"
    exit 0 ;;
start)
    [ $# -eq 3 ] || die "usage: $0 start DIR PORT" ;;
*)
    die "usage: $0 install | start DIR PORT | stop DIR | query DIR SQL" ;;
esac

mkdir -p "$2"
dir=$(cd "$2" && pwd)
port=$3
pg=$(bin)
home=$(home_of "$dir")
if [ "$(id -u)" -eq 0 ] && [ "$home" = "$dir" ]; then
    chown postgres: "$dir"
    if ! runuser -u postgres -- test -w "$dir"; then
        # The postgres user cannot reach DIR: a folder above it is closed to other users (as
        # `mktemp -d` makes them). The server's files go in a folder it owns, named after DIR;
        # DIR/server and DIR/data link there, so DIR still finds them. Removing DIR leaves them.
        home=/var/lib/postgresql/photoedit/$(printf '%s' "$dir" | sha256sum | cut -c1-16)
        mkdir -p "$home" && chown postgres: /var/lib/postgresql/photoedit "$home"
        ln -sfn "$home" "$dir/server"
        ln -sfn "$home/data" "$dir/data"
    fi
fi
if [ ! -f "$dir/data/PG_VERSION" ]; then
    password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
    as_owner bash -c "umask 077; echo '$password' > '$home/password'"
    # A throwaway server's new files are not flushed either (`--no-sync`): nothing of it is kept,
    # and the tests running beside it share the disk.
    nosync=""; [ "${POSTGRES_THROWAWAY:-0}" = 1 ] && nosync="--no-sync"
    as_owner "$pg/initdb" -D "$home/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 $nosync \
        --pwfile="$home/password" -E UTF8 --locale=C.UTF-8 >"$home/initdb.log" 2>&1 || { cat "$home/initdb.log" >&2; die "initdb failed"; }
    fresh=1
fi
# POSTGRES_HBA_NETWORK (a CIDR, e.g. 10.197.3.0/24): clients on that network may log in with the
# password too (scripts/hosts.sh: the services on other hosts), beside loopback's.
if [ -n "${POSTGRES_HBA_NETWORK:-}" ] && ! grep -q "^host all all $POSTGRES_HBA_NETWORK " "$home/data/pg_hba.conf"; then
    as_owner bash -c "echo 'host all all $POSTGRES_HBA_NETWORK scram-sha-256' >> '$home/data/pg_hba.conf'"
fi
bind=${POSTGRES_BIND:-127.0.0.1}
# random_page_cost 1.1, not 4: the working set is in memory, where a page read by index costs about
# what one read in sequence does. With 4, reads of a few dozen jobs by id (`id = ANY`) scanned the
# whole table until it held tens of thousands of rows: 0.85 ms a read instead of 0.2 (bench-jobs).
# PostgreSQL's documentation suggests lowering it so for a cached database; so should the
# operator of any server the services use (docs/operating.md).
settings="-c random_page_cost=1.1 -c fsync=on"
[ "${POSTGRES_THROWAWAY:-0}" = 1 ] && settings="-c random_page_cost=1.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
# POSTGRES_STATEMENT_STATS=1: pg_stat_statements counts every statement (BEGIN and COMMIT included),
# what the benchmarks read their round trips from.
[ "${POSTGRES_STATEMENT_STATS:-0}" = 1 ] && settings+=" -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_utility=on"
as_owner "$pg/pg_ctl" -D "$home/data" -l "$home/postgres.log" -w -t 60 \
    -o "-p $port -k $home -c listen_addresses=$bind -c max_connections=${POSTGRES_MAX_CONNECTIONS:-200} $settings" start >/dev/null \
    || { tail -20 "$home/postgres.log" >&2; die "the server did not start"; }
password=$(cat "$home/password" 2>/dev/null || as_owner cat "$home/password")
if [ -n "${fresh:-}" ]; then
    as_owner "$pg/psql" -h "$home" -p "$port" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 \
        -c "CREATE ROLE photoedit LOGIN CREATEDB PASSWORD '$password'" -c "CREATE DATABASE photoedit OWNER photoedit" >/dev/null
fi
if [ "${POSTGRES_STATEMENT_STATS:-0}" = 1 ]; then
    as_owner "$pg/psql" -h "$home" -p "$port" -U postgres -d photoedit -qAt -v ON_ERROR_STOP=1 \
        -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
fi
echo "POSTGRES_URL=postgres://photoedit:$password@127.0.0.1:$port/photoedit" > "$dir/postgres.env"
cat "$dir/postgres.env"
