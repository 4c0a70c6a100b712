#!/usr/bin/env bash
# The demo main job, first cut: declare the topics, produce keyed events through the real
# transport and tail them back. TRANSPORT=redis (default, Redis Streams) or kafka.
source "$(dirname "$0")/common.sh"
PIPELINE="$ROOT/.venv/bin/pipeline"
T="${TRANSPORT:-redis}"
[ "$T" = kafka ] && bash "$ROOT/deploy/local/kafka.sh" up

printf '\n== declaring topics/*.yaml on %s\n' "$T"
"$PIPELINE" topics apply "$ROOT/topics" -t "$T"

printf '\n== producing 12 webhook-like events for 3 conversations of 2 tenants\n'
for i in $(seq 1 12); do
  conv="conv-$(( i % 3 ))"; tenant="tenant-$(( i % 2 ))"
  "$PIPELINE" produce messages -t "$T" --key "$conv" -H "pl-tenant=$tenant" -H "pl-event-id=evt-$i" \
    --value "{\"conversation_id\": \"$conv\", \"text\": \"message $i\"}"
done

printf '\n== tailing them back (each conversation stays on one partition, in order)\n'
"$PIPELINE" tail messages -t "$T" --from-beginning --limit 12
