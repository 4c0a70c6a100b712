#!/usr/bin/env bash
# Starts (up), stops (down) or lists (status) the local services the pipeline and its tests use.
# Usage: services.sh up|down|status [redis] [postgres] [kafka] [redis-cluster] [s3proxy] [jaeger]
# (default: all but jaeger for up, which builds it the first time, ~8 min; all for down, status)
source "$(dirname "$0")/common.sh"
USAGE="usage: services.sh up|down|status [redis] [postgres] [kafka] [redis-cluster] [s3proxy] [jaeger]"
action="${1:-up}"; shift || true
case "$action" in
  up|down|status) ;;
  -h|--help|help) echo "$USAGE"; exit 0 ;;
  *) printf "[services] error: unknown subcommand '%s'\n%s\n" "$action" "$USAGE" >&2; exit 2 ;;
esac
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(redis postgres kafka redis-cluster s3proxy)
  [ "$action" = up ] || names+=(jaeger)
fi
for n in "${names[@]}"; do
  case "$n" in
    redis|postgres|kafka|redis-cluster|s3proxy|jaeger) bash "$ROOT/deploy/local/$n.sh" "$action" ;;
    *) die "unknown service '$n' (expected redis, postgres, kafka, redis-cluster, s3proxy or jaeger)" ;;
  esac
done
if [ "$action" = up ]; then
  printf '\nservices:\n'
  for n in "${names[@]}"; do printf '  '; bash "$ROOT/deploy/local/$n.sh" status; done
  cat <<EOT

point the pipeline at them with (these are also the defaults):
  PIPELINE_REDIS__URL=redis://127.0.0.1:6379/0
  PIPELINE_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092
  PIPELINE_POSTGRES__URL=postgresql://pipeline:pipeline@127.0.0.1:5432/pipeline

and offloaded payloads (docs/offload.md) at S3Proxy with:
  AWS_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=pipeline AWS_SECRET_ACCESS_KEY=pipeline-local-secret
EOT
fi
