#!/usr/bin/env bash
# Apache Kafka 4.x, single node, KRaft combined mode, from the Maven Central artifact
# org.apache.kafka:kafka_2.13 on 127.0.0.1:9092 (override with KAFKA_PORT).
# Usage: kafka.sh up|down|status
source "$(dirname "$0")/common.sh"
HERE="$ROOT/deploy/local/kafka"
PORT="${KAFKA_PORT:-9092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
VERSION="$(grep -o '<kafka.version>[^<]*' "$HERE/pom.xml" | cut -d'>' -f2)"
LIBS="$CACHE_DIR/kafka-$VERSION/libs"
DIR="$STATE_DIR/kafka"

fetch_libs() {
  [ -f "$LIBS/kafka_2.13-$VERSION.jar" ] && return
  maven_fetch "kafka_2.13 $VERSION" "$HERE/pom.xml" "$LIBS"
}

java_cp() { java -Xms64m -Xmx256m -cp "$LIBS/*" "$@"; }

ready() { [ -f "$DIR/broker.ready" ] || grep -q "Kafka Server started" "$DIR/logs/server.log" 2>/dev/null; }

# kafka_answers: the program on PORT answers a Kafka ApiVersions v0 request (api key 18,
# correlation id 1, no client id) with correlation id 1.
kafka_answers() {
  local reply
  reply="$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"
    printf "\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff" >&3
    head -c 8 <&3' "$PORT" 2>/dev/null | od -An -tx1 | tr -d ' \n' || true)"
  [ "${reply:8:8}" = 00000001 ]
}

up() {
  if port_open 127.0.0.1 "$PORT"; then
    kafka_answers || held_by_stranger kafka "$PORT" KAFKA_PORT
    log "kafka already running on 127.0.0.1:$PORT (left as it is)"
    return
  fi
  fetch_libs
  mkdir -p "$DIR/logs"
  sed -e "s#@DATA_DIR@#$DIR/data#" -e "s#@PORT@#$PORT#g" -e "s#@CONTROLLER_PORT@#$CONTROLLER_PORT#g" \
    "$HERE/server.properties.in" >"$DIR/server.properties"
  if [ ! -f "$DIR/data/meta.properties" ]; then
    local cluster_id
    cluster_id="$(java_cp kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
    log "formatting $DIR/data (cluster $cluster_id)"
    java_cp kafka.tools.StorageTool format --standalone -t "$cluster_id" \
      -c "$DIR/server.properties" >"$DIR/logs/format.log" 2>&1 \
      || die "kafka storage format failed (see $DIR/logs/format.log)"
  fi
  : >"$DIR/logs/server.log"
  # A 512 MiB heap is plenty for one loopback broker and leaves the 2-core box its memory.
  nohup java -Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
    -Dkafka.logs.dir="$DIR/logs" -Dlog4j2.configurationFile="$HERE/log4j2.properties" \
    -cp "$LIBS/*" kafka.Kafka "$DIR/server.properties" >"$DIR/logs/stdout.log" 2>&1 &
  echo $! >"$DIR/kafka.pid"
  mark_started kafka
  wait_started kafka "$DIR/kafka.pid" 120 "$PORT" "$DIR/logs/stdout.log and server.log"
  log "kafka $VERSION ready on 127.0.0.1:$PORT (KRaft, data $DIR/data)"
}

down() { stop_started kafka "$DIR/kafka.pid" 60; }

status() { if port_open 127.0.0.1 "$PORT"; then echo "kafka     127.0.0.1:$PORT"; else echo "kafka     down"; fi; }

"${1:-up}"
