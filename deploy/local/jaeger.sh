#!/usr/bin/env bash
# Jaeger v2 (one binary: OTLP on 4317/4318, query API on 16686, in-memory storage), built from
# its Go module github.com/jaegertracing/jaeger/cmd/jaeger and cached in ~/.cache/pipeline. The
# module has no UI assets (Jaeger's release builds embed them), so 16686 serves a placeholder page
# unless jaeger-ui.sh has built the UI (`make jaeger-ui`): then `up` serves that build.
# The build takes minutes, so it happens on `build` or `up` only, never as part of `make test`.
# Usage: jaeger.sh build|up|down|status|built|links
source "$(dirname "$0")/common.sh"
HERE="$ROOT/deploy/local/jaeger"
VERSION="${JAEGER_VERSION:-v1.76.0}"
BIN="$CACHE_DIR/jaeger-$VERSION/jaeger"
QUERY_PORT="${JAEGER_QUERY_PORT:-16686}"
OTLP_HTTP_PORT="${JAEGER_OTLP_HTTP_PORT:-4318}"
DIR="$STATE_DIR/jaeger"

build() { go_tool_build jaeger "$VERSION" github.com/jaegertracing/jaeger/cmd/jaeger "$BIN"; }

up() {
  if port_open 127.0.0.1 "$QUERY_PORT"; then
    log "jaeger already running on 127.0.0.1:$QUERY_PORT (left as it is)"
    return
  fi
  build
  mkdir -p "$DIR"
  local ui=""
  if bash "$ROOT/deploy/local/jaeger-ui.sh" built; then ui="$(bash "$ROOT/deploy/local/jaeger-ui.sh" path)"; fi
  sed -e "s#@UI_ASSETS@#$ui#g" -e "s#@QUERY_PORT@#$QUERY_PORT#g" -e "s#@OTLP_HTTP_PORT@#$OTLP_HTTP_PORT#g" \
    -e "s#@OTLP_GRPC_PORT@#${JAEGER_OTLP_GRPC_PORT:-4317}#g" \
    "$HERE/config.yaml.in" >"$DIR/config.yaml"
  nohup "$BIN" --config "$DIR/config.yaml" >"$DIR/jaeger.log" 2>&1 &
  echo $! >"$DIR/jaeger.pid"
  mark_started jaeger
  local deadline=$((SECONDS + 60))
  until port_open 127.0.0.1 "$QUERY_PORT" && port_open 127.0.0.1 "$OTLP_HTTP_PORT"; do
    kill -0 "$(cat "$DIR/jaeger.pid")" 2>/dev/null || die "jaeger exited at start (see $DIR/jaeger.log)"
    (( SECONDS < deadline )) || die "jaeger not ready after 60s (see $DIR/jaeger.log)"
    sleep 0.2
  done
  log "jaeger $VERSION ready: query API http://127.0.0.1:$QUERY_PORT/api, OTLP/HTTP 127.0.0.1:$OTLP_HTTP_PORT${ui:+, UI http://127.0.0.1:$QUERY_PORT/}"
}

down() {
  if started_by_us jaeger && [ -f "$DIR/jaeger.pid" ]; then
    kill "$(cat "$DIR/jaeger.pid")" 2>/dev/null || true
    clear_started jaeger
    log "jaeger stopped"
  else
    log "jaeger: not started by these scripts, left running"
  fi
}

status() {
  if port_open 127.0.0.1 "$QUERY_PORT"; then echo "jaeger    127.0.0.1:$QUERY_PORT (OTLP/HTTP $OTLP_HTTP_PORT)"
  elif [ -x "$BIN" ]; then echo "jaeger    down (built)"
  else echo "jaeger    not built (make jaeger builds and starts it, ~8 min)"; fi
}

# built: exit 0 when the binary is cached (make demo starts Jaeger only then).
built() { [ -x "$BIN" ]; }

# links: one trace of the demo's flooder and one of a small tenant (UI pages, else query API).
trace_of() {
  curl -fsS "http://127.0.0.1:$QUERY_PORT/api/traces?service=pipeline-ingress&limit=1&tags=%7B%22pipeline.tenant%22%3A%22$1%22%7D" 2>/dev/null \
    | grep -o '"traceID":"[0-9a-f]*"' | head -1 | cut -d'"' -f4 || true
}
links() {
  local id n small=""
  id="$(trace_of tenant-flood)"
  for n in $(seq 5 49); do  # tenants 05..49 send 0.6 events/s: one in ten is sampled
    small="$(trace_of "tenant-$(printf %02d "$n")")"
    [ -z "$small" ] || { n="$(printf %02d "$n")"; break; }
  done
  local page="api/traces"  # the query API's JSON, or the UI's page when it is built
  if bash "$ROOT/deploy/local/jaeger-ui.sh" built; then page="trace"; fi
  printf 'trace of the flooder:        %s\n' "${id:+http://127.0.0.1:$QUERY_PORT/$page/$id}"
  printf 'trace of a small tenant:     %s\n' "${small:+http://127.0.0.1:$QUERY_PORT/$page/$small (tenant-$n)}"
}

case "${1:-up}" in
  build) build ;; up) up ;; down) down ;; status) status ;; built) built ;; links) links ;;
  *) die "usage: jaeger.sh build|up|down|status|built|links" ;;
esac
