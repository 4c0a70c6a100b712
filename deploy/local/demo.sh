#!/usr/bin/env bash
# The demo main job (docs/demo.md): ingress, registry, the example consumer groups, the sweeper
# and a noisy-neighbour traffic generator, with a live dashboard, a summary and plots.
# `make demo` starts Redis first; this script starts Kafka itself when TRANSPORT=kafka.
# Environment: TRANSPORT=redis|kafka (default redis), DURATION (traffic time, default 3m),
# HEADLESS=1 (no live dashboard; also without a TTY), DEMO_OUTPUT (default demo-output),
# DEMO_PREFIX (Redis key prefix; default a fresh one per run), DRAIN_TIMEOUT (default 60s).
# Ctrl-C stops everything the demo started.
source "$(dirname "$0")/common.sh"
PY="$ROOT/.venv/bin/python"
T="${TRANSPORT:-redis}"
if [ "$T" = kafka ]; then bash "$ROOT/deploy/local/kafka.sh" up; fi

# The plots need the optional `demo` extra (matplotlib); install it once.
if ! "$PY" -c 'import matplotlib' >/dev/null 2>&1; then
  log "installing the demo extra (matplotlib)"
  "$ROOT/.venv/bin/pip" install -q -e "$ROOT[demo]"
fi

args=(--transport "$T" --duration "${DURATION:-3m}" --output "${DEMO_OUTPUT:-demo-output}"
      --drain-timeout "${DRAIN_TIMEOUT:-60s}")
case "${HEADLESS:-0}" in 1|true|yes) args+=(--headless) ;; esac
[ -n "${DEMO_PREFIX:-}" ] && args+=(--prefix "$DEMO_PREFIX")
cd "$ROOT"
# Traces go to Jaeger when it runs (make jaeger), one event in ten, unless OTEL_* says otherwise.
if port_open 127.0.0.1 "${JAEGER_QUERY_PORT:-16686}" && [ -z "${OTEL_EXPORTER_OTLP_ENDPOINT:-}" ]; then
  export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:${JAEGER_OTLP_HTTP_PORT:-4318}"
  export OTEL_TRACES_SAMPLER="${OTEL_TRACES_SAMPLER:-parentbased_traceidratio}"
  export OTEL_TRACES_SAMPLER_ARG="${OTEL_TRACES_SAMPLER_ARG:-0.1}"
fi
# The demo replaces this shell, so a SIGINT sent to the script reaches it (a foreground child
# of a script never sees a signal sent to the script alone); it prints the trace links itself.
exec "$PY" -m demo "${args[@]}"
