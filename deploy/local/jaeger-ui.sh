#!/usr/bin/env bash
# The Jaeger UI's assets for the Jaeger built by jaeger.sh. The Go module has only a placeholder
# page (Jaeger's release builds embed the UI, which is built from its own repository, jaeger-ui,
# and is not published to npm), so this builds jaeger-ui's source at the tag of the same version
# with npm and caches the result in ~/.cache/pipeline/jaeger-ui-<version>/; jaeger.sh then serves
# it (jaeger_query's ui.assets_path) instead of the placeholder. Never part of `make test`.
#
# The source: JAEGER_UI_SRC, a checkout of https://github.com/jaegertracing/jaeger-ui at the tag
# (git clone --depth 1 --branch v1.76.0 ...) or an unpacked archive of it; it is copied, never
# changed. Needs node and npm (apt: nodejs npm); the build takes a few minutes.
# Usage: jaeger-ui.sh build|built|path
source "$(dirname "$0")/common.sh"
VERSION="${JAEGER_VERSION:-v1.76.0}"
ASSETS="$CACHE_DIR/jaeger-ui-$VERSION"

build() {
  [ -f "$ASSETS/index.html" ] && return
  local src="${JAEGER_UI_SRC:-}"
  [ -n "$src" ] || die "JAEGER_UI_SRC is not set: point it at a jaeger-ui $VERSION source tree (git clone --depth 1 --branch $VERSION https://github.com/jaegertracing/jaeger-ui)"
  [ -f "$src/packages/jaeger-ui/package.json" ] || die "$src is not a jaeger-ui source tree (no packages/jaeger-ui/package.json)"
  local found
  found="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$src/packages/jaeger-ui/package.json" | head -1)"
  [ "v$found" = "$VERSION" ] || die "$src is jaeger-ui v$found, Jaeger is $VERSION: check out the tag $VERSION"
  command -v npm >/dev/null || apt_install nodejs npm
  local scratch="$CACHE_DIR/jaeger-ui-$VERSION.build"
  rm -rf "$scratch"; mkdir -p "$scratch"
  log "building jaeger-ui $VERSION from $src (a few minutes)"
  (
    cp -a "$src/." "$scratch/"
    cd "$scratch"
    # Its engines field asks for a newer node than Debian's; the build itself runs on node 20.
    # --ignore-scripts skips the git hooks set-up; the one script the build needs is run below.
    npm ci --engine-strict=false --ignore-scripts --no-audit --no-fund
    (cd packages/plexus && npm run build)
    (cd packages/jaeger-ui && npm run build)
  ) >"$CACHE_DIR/jaeger-ui-build.log" 2>&1 || die "jaeger-ui build failed (see $CACHE_DIR/jaeger-ui-build.log)"
  [ -f "$scratch/packages/jaeger-ui/build/index.html" ] || die "jaeger-ui build made no index.html (see $CACHE_DIR/jaeger-ui-build.log)"
  rm -rf "$ASSETS.tmp"
  cp -a "$scratch/packages/jaeger-ui/build" "$ASSETS.tmp"
  mv "$ASSETS.tmp" "$ASSETS"
  rm -rf "$scratch"
  log "jaeger-ui $VERSION built: $ASSETS (restart Jaeger to serve it: services.sh down jaeger; up jaeger)"
}

# built: exit 0 when the assets are cached (jaeger.sh serves them then).
built() { [ -f "$ASSETS/index.html" ]; }

case "${1:-build}" in
  build) build ;; built) built ;; path) echo "$ASSETS" ;;
  *) die "usage: jaeger-ui.sh build|built|path" ;;
esac
