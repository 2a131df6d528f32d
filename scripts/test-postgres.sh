#!/usr/bin/env bash
# Runs a command against a throwaway PostgreSQL server:
#   scripts/test-postgres.sh cargo nextest run -p forkyard-budget-ledger
# Starts a cluster in a temp dir on a free 127.0.0.1 port (as the `postgres` user when
# run as root: the server refuses to run as root), creates a database, exports its URL
# as FORKYARD_TEST_POSTGRES_URL for the command, and stops the server afterwards.
# Needs Debian's `postgresql` package (`make deps-apt` installs it).
set -euo pipefail

bindir="${PG_BINDIR:-}"
if [ -z "$bindir" ]; then
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && bindir="$d"; done
fi
if [ -z "$bindir" ] && command -v initdb >/dev/null; then bindir="$(dirname "$(command -v initdb)")"; fi
[ -n "$bindir" ] && [ -x "$bindir/pg_ctl" ] || { echo "test-postgres: initdb/pg_ctl not found (apt-get install postgresql)" >&2; exit 1; }

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
dir="$(mktemp -d /tmp/forkyard-pg.XXXXXX)"
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres
  chown postgres "$dir"
  as_pg() { runuser -u postgres -- "$@"; }
  user=postgres
else
  as_pg() { "$@"; }
  user="$(id -un)"
fi

cleanup() {
  as_pg "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

as_pg "$bindir/initdb" -D "$dir/data" -U "$user" --auth=trust -E UTF8 --no-instructions >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-h 127.0.0.1 -p $port -k $dir -c fsync=on -c max_connections=300" start >/dev/null \
  || { cat "$dir/server.log" >&2; exit 1; }
as_pg "$bindir/createdb" -h 127.0.0.1 -p "$port" -U "$user" forkyard_ledger

export FORKYARD_TEST_POSTGRES_URL="postgres://$user@127.0.0.1:$port/forkyard_ledger"
echo "test-postgres: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') at $FORKYARD_TEST_POSTGRES_URL" >&2
"$@"
