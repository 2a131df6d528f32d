#!/bin/sh
# Debian's PostgreSQL 15 in a container: on an empty data directory, make the cluster,
# the user POSTGRES_USER (password POSTGRES_PASSWORD) and the database POSTGRES_DB;
# then run the server in the foreground, reachable from the container network with a
# password (scram-sha-256).
set -eu
bin=/usr/lib/postgresql/15/bin
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:?POSTGRES_USER is not set}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}"
: "${POSTGRES_DB:=$POSTGRES_USER}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "host all all ::/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$POSTGRES_DB" != postgres ]; then
    "$bin/createdb" -U "$POSTGRES_USER" "$POSTGRES_DB"
  fi
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
