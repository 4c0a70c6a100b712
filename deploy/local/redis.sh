#!/usr/bin/env bash
# Redis 7 from apt on 127.0.0.1:6379 (override with REDIS_PORT). Usage: redis.sh up|down|status
source "$(dirname "$0")/common.sh"
PORT="${REDIS_PORT:-6379}"
DIR="$STATE_DIR/redis"

# The timeout: a program on the port that accepts connections but never answers would hang redis-cli.
ping() { timeout 5 redis-cli -h 127.0.0.1 -p "$PORT" ping 2>&1 | grep -q PONG; }

up() {
  command -v redis-server >/dev/null || apt_install redis-server redis-tools
  if port_open 127.0.0.1 "$PORT"; then
    # A Redis still loading its data answers LOADING: wait for it; anything else is not Redis.
    local reply
    reply="$(timeout 5 redis-cli -h 127.0.0.1 -p "$PORT" ping 2>&1 || true)"
    case "$reply" in
      PONG|*LOADING*) wait_until 30 "redis on 127.0.0.1:$PORT" ping ;;
      *) held_by_stranger redis "$PORT" REDIS_PORT ;;
    esac
    log "redis already running on 127.0.0.1:$PORT (left as it is)"
    return
  fi
  mkdir -p "$DIR"
  # appendonly+everysec: a Redis restart keeps throttle, lease and debounce state (at most 1 s lost).
  redis-server --bind 127.0.0.1 --port "$PORT" --daemonize yes \
    --dir "$DIR" --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" \
    --appendonly yes --appendfsync everysec --save ""
  wait_until 30 "redis on 127.0.0.1:$PORT" ping
  mark_started redis
  log "redis $(redis-server --version | grep -o 'v=[0-9.]*') ready on 127.0.0.1:$PORT (data $DIR)"
}

down() {
  if started_by_us redis && [ -f "$DIR/redis.pid" ]; then
    redis-cli -h 127.0.0.1 -p "$PORT" shutdown nosave >/dev/null 2>&1 || kill "$(cat "$DIR/redis.pid")" 2>/dev/null || true
    clear_started redis
    log "redis stopped"
  else
    log "redis: not started by these scripts, left running"
  fi
}

status() { if port_open 127.0.0.1 "$PORT"; then echo "redis     redis://127.0.0.1:$PORT/0"; else echo "redis     down"; fi; }

"${1:-up}"
