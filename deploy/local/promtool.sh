#!/usr/bin/env bash
# promtool (Prometheus's rule checker and rule unit-test runner), built from its Go module
# github.com/prometheus/prometheus/cmd/promtool and cached in ~/.cache/pipeline. tests/deploy runs
# it on deploy/prometheus/alerts.yaml and on the KEDA queries of deploy/k8s; those tests skip when
# it is not built. The build takes minutes, so it happens on `build` only, never as part of
# `make test`.
# Usage: promtool.sh build|built|path
source "$(dirname "$0")/common.sh"
VERSION="${PROMTOOL_VERSION:-v0.316.0}"
BIN="$CACHE_DIR/promtool-$VERSION/promtool"

build() {
  [ -x "$BIN" ] && return
  command -v go >/dev/null || apt_install golang-go
  local scratch="$CACHE_DIR/promtool-$VERSION.build"
  rm -rf "$scratch"; mkdir -p "$scratch"
  log "building promtool $VERSION from github.com/prometheus/prometheus/cmd/promtool (several minutes)"
  (
    cd "$scratch"
    go mod init pipeline.local/promtool >/dev/null 2>&1
    go get -tool "github.com/prometheus/prometheus/cmd/promtool@$VERSION"
    go build -trimpath -o promtool github.com/prometheus/prometheus/cmd/promtool
  ) >"$CACHE_DIR/promtool-build.log" 2>&1 || die "promtool build failed (see $CACHE_DIR/promtool-build.log)"
  mkdir -p "$(dirname "$BIN")"
  mv "$scratch/promtool" "$BIN"
  rm -rf "$scratch"
  log "promtool $VERSION built: $BIN"
}

# built: exit 0 when the binary is cached. path: print where it is (or would be) cached.
built() { [ -x "$BIN" ]; }
path() { echo "$BIN"; }

case "${1:-build}" in
  build) build ;; built) built ;; path) path ;;
  *) die "usage: promtool.sh build|built|path" ;;
esac
