#!/usr/bin/env bash
# PostgreSQL from apt, database and role `pipeline` (password `pipeline`) on 127.0.0.1:5432.
# Usage: postgres.sh up|down|status
source "$(dirname "$0")/common.sh"
PORT="${PGPORT:-5432}"

ready() { pg_isready -h 127.0.0.1 -p "$PORT" -q; }

cluster() { pg_lsclusters -h 2>/dev/null | awk -v p="$PORT" '$3 == p {print $1, $2; exit}'; }

up() {
  if ! command -v pg_lsclusters >/dev/null || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
    apt_install postgresql postgresql-client
  fi
  # The tests also run the PostgreSQL stores through a transaction-mode PgBouncer of their own
  # (each starts one on a free port; the package's own service is not used).
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || apt_install pgbouncer
  if port_open 127.0.0.1 "$PORT"; then
    # pg_isready exits 2 when nothing on the port answers as PostgreSQL (1: it is starting).
    local rc=0
    pg_isready -h 127.0.0.1 -p "$PORT" -t 5 -q || rc=$?
    [ "$rc" != 2 ] || held_by_stranger postgresql "$PORT" PGPORT
    log "postgresql already running on 127.0.0.1:$PORT (left as it is)"
  else
    local c
    c="$(cluster)"
    if [ -z "$c" ]; then
      local ver
      ver="$(ls /usr/lib/postgresql | sort -V | tail -1)"
      log "creating cluster $ver/main on port $PORT"
      pg_createcluster -p "$PORT" "$ver" main >/dev/null
      c="$ver main"
    fi
    # shellcheck disable=SC2086
    pg_ctlcluster $c start
    mark_started postgres
    echo "$c" >"$STATE_DIR/postgres.cluster"
  fi
  wait_until 60 "postgresql on 127.0.0.1:$PORT" ready
  # Role and database are created once; re-running is a no-op.
  su postgres -c "psql -p $PORT -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='pipeline'\"" | grep -q 1 \
    || su postgres -c "psql -p $PORT -qc \"CREATE ROLE pipeline LOGIN PASSWORD 'pipeline' CREATEDB\""
  su postgres -c "psql -p $PORT -qtAc \"SELECT 1 FROM pg_database WHERE datname='pipeline'\"" | grep -q 1 \
    || su postgres -c "createdb -p $PORT -O pipeline pipeline"
  log "postgresql ready on 127.0.0.1:$PORT (database pipeline, user pipeline)"
}

down() {
  if started_by_us postgres; then
    # shellcheck disable=SC2046
    pg_ctlcluster $(cat "$STATE_DIR/postgres.cluster") stop || true
    clear_started postgres
    log "postgresql stopped"
  else
    log "postgresql: not started by these scripts, left running"
  fi
}

status() {
  if port_open 127.0.0.1 "$PORT"; then echo "postgres  postgresql://pipeline:pipeline@127.0.0.1:$PORT/pipeline"; else echo "postgres  down"; fi
}

"${1:-up}"
