#!/usr/bin/env bash
# docs/jaeger-trace.png: one real trace in the Jaeger UI, taken with headless Chromium.
# Runs tests/tracing/test_traces.py on Kafka (a signed webhook through the ingress, Kafka, a
# lane that fails it once, the retry tier, success; the test also sends its spans to Jaeger),
# finds that webhook's trace through Jaeger's query API and screenshots its page.
# Needs Jaeger running with the UI built (`make jaeger-ui`, then `make jaeger`) and the shared
# services; installs chromium from apt when missing. Not part of `make test`.
# Usage: jaeger-screenshot.sh [OUT.png]   (default docs/jaeger-trace.png)
source "$(dirname "$0")/common.sh"
QUERY="http://127.0.0.1:${JAEGER_QUERY_PORT:-16686}"
OUT="${1:-$ROOT/docs/jaeger-trace.png}"
SERVICE="pipeline"

bash "$ROOT/deploy/local/jaeger-ui.sh" built || die "the Jaeger UI is not built: make jaeger-ui"
page="$(curl -fsS "$QUERY/" 2>/dev/null || true)"
[[ "$page" == *'id="jaeger-ui-root"'* ]] \
  || die "no Jaeger UI on $QUERY: start Jaeger after building the UI (services.sh down jaeger; make jaeger)"
command -v chromium >/dev/null || apt_install chromium

log "running a webhook through ingress, Kafka, a failing lane and its retry tier"
(cd "$ROOT" && OTEL_SERVICE_NAME="$SERVICE" .venv/bin/pytest -q -p no:cacheprovider \
  "tests/tracing/test_traces.py::test_one_trace_per_webhook_through_retry_dead_letter_and_redrive[kafka]") \
  >&2 || die "the traced test failed"

# The newest trace of the retried webhook (the outcome tag is on its first process span).
tags='%7B%22pipeline.outcome%22%3A%22retried%22%7D'
found="$(curl -fsS "$QUERY/api/traces?service=$SERVICE&tags=$tags&limit=1&lookback=1h" || true)"
id="$(grep -o '"traceID":"[0-9a-f]*"' <<<"$found" | head -1 | cut -d'"' -f4 || true)"
[ -n "$id" ] || die "Jaeger has no retried trace of service $SERVICE"
log "trace $id: $QUERY/trace/$id"

shot="$(mktemp -d)"
trap 'rm -rf "$shot"' EXIT
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$shot/profile" \
  --window-size=1500,660 --virtual-time-budget=20000 --screenshot="$shot/trace.png" \
  "$QUERY/trace/$id" >/dev/null 2>&1 || die "chromium could not take the screenshot"
cp "$shot/trace.png" "$OUT"
log "screenshot: $OUT ($(wc -c <"$OUT") bytes)"
