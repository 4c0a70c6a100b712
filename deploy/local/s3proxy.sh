#!/usr/bin/env bash
# S3Proxy, an S3-compatible object store on a filesystem backend, from the Maven Central artifact
# org.gaul:s3proxy (classifier jar-with-dependencies) on 127.0.0.1:9000 (override with
# S3PROXY_PORT). Offloaded payloads (docs/offload.md) and their tests use it; the bucket
# `pipeline` exists from the start; the demo offloads its large bodies to it when it runs.
# Usage: s3proxy.sh up|down|status|built
source "$(dirname "$0")/common.sh"
HERE="$ROOT/deploy/local/s3proxy"
PORT="${S3PROXY_PORT:-9000}"
VERSION="$(grep -o '<s3proxy.version>[^<]*' "$HERE/pom.xml" | cut -d'>' -f2)"
LIBS="$CACHE_DIR/s3proxy-$VERSION"
JAR="$LIBS/s3proxy-$VERSION-jar-with-dependencies.jar"
DIR="$STATE_DIR/s3proxy"
# Local-only credentials; the pipeline reads them from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
IDENTITY="${S3PROXY_IDENTITY:-pipeline}"
CREDENTIAL="${S3PROXY_CREDENTIAL:-pipeline-local-secret}"
BUCKET=pipeline

fetch_jar() {
  [ -f "$JAR" ] && return
  maven_fetch "s3proxy $VERSION (jar-with-dependencies)" "$HERE/pom.xml" "$LIBS"
}

ready() { grep -q "Started" "$DIR/s3proxy.log" 2>/dev/null; }

# s3_answers: the program on PORT answers an HTTP request as an S3 service (x-amz-request-id).
s3_answers() {
  local reply
  reply="$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"
    printf "GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3
    head -c 4096 <&3' "$PORT" 2>/dev/null || true)"
  grep -qi '^x-amz-request-id:' <<<"$reply"
}

up() {
  if port_open 127.0.0.1 "$PORT"; then
    s3_answers || held_by_stranger s3proxy "$PORT" S3PROXY_PORT
    log "s3proxy already running on 127.0.0.1:$PORT (left as it is)"
    return
  fi
  fetch_jar
  mkdir -p "$DIR/data/$BUCKET"
  cat >"$DIR/s3proxy.conf" <<CONF
s3proxy.endpoint=http://127.0.0.1:$PORT
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$IDENTITY
s3proxy.credential=$CREDENTIAL
jclouds.provider=filesystem
jclouds.filesystem.basedir=$DIR/data
CONF
  : >"$DIR/s3proxy.log"
  # A 256 MiB heap is plenty: objects stream to disk, never through the heap whole.
  nohup java -Xms64m -Xmx256m -Djava.awt.headless=true -jar "$JAR" \
    --properties "$DIR/s3proxy.conf" >"$DIR/s3proxy.log" 2>&1 &
  echo $! >"$DIR/s3proxy.pid"
  mark_started s3proxy
  wait_started s3proxy "$DIR/s3proxy.pid" 60 "$PORT" "$DIR/s3proxy.log"
  log "s3proxy $VERSION ready on 127.0.0.1:$PORT (bucket $BUCKET, data $DIR/data)"
}

# built: exit 0 when the jar is cached (make demo starts S3Proxy only then).
built() { [ -f "$JAR" ]; }

down() { stop_started s3proxy "$DIR/s3proxy.pid" 30; }

status() { if port_open 127.0.0.1 "$PORT"; then echo "s3proxy   http://127.0.0.1:$PORT (bucket $BUCKET)"; else echo "s3proxy   down"; fi; }

"${1:-up}"
