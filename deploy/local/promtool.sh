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

build() { go_tool_build promtool "$VERSION" github.com/prometheus/prometheus/cmd/promtool "$BIN"; }

# built: exit 0 when the binary is cached. path: print where it is (or would be) cached.
built() { [ -x "$BIN" ]; }
path() { echo "$BIN"; }

case "${1:-build}" in
  build) build ;; built) built ;; path) path ;;
  *) die "usage: promtool.sh build|built|path" ;;
esac
