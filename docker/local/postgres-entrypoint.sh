#!/bin/sh
# The official postgres image's entrypoint, as far as docker/compose.yaml relies on it:
# an empty PGDATA is initialised with POSTGRES_USER (default postgres) as superuser with
# POSTGRES_PASSWORD, password (SCRAM) authentication from any address, the server
# listening on every address, and the database POSTGRES_DB (default: the user's name).
# Then the command runs (default `postgres`, as PID 1).
set -eu

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set to initialise the database}"
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 > /dev/null
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
        # Single-user mode: nothing listens (and no healthcheck passes) before it is done.
        printf 'CREATE DATABASE "%s" OWNER "%s";\n' "$db" "$user" \
            | postgres --single -j -D "$PGDATA" postgres > /dev/null
    fi
    echo "postgres-entrypoint: initialised $PGDATA (user $user, database $db)"
fi

exec "$@"
