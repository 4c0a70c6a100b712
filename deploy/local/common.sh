# Shared helpers for the deploy/local service scripts. Sourced, never run.
# State (pids, data, "we started it" markers) lives in $PIPELINE_STATE_DIR, default .services/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE_DIR="${PIPELINE_STATE_DIR:-$ROOT/.services}"
CACHE_DIR="${PIPELINE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pipeline}"
mkdir -p "$STATE_DIR" "$CACHE_DIR"

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

# port_open HOST PORT: true when something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# held_by_stranger NAME PORT VARIABLE: die saying the port is taken by a program that is not NAME.
held_by_stranger() {
  die "127.0.0.1:$2 is held by something that does not answer as $1: stop it or set $3 to a free port"
}

# wait_until SECONDS DESCRIPTION CMD...: polls CMD every 0.2 s until it succeeds or time runs out.
# Readiness is always checked by asking the service, never assumed after a fixed sleep.
wait_until() {
  local limit_s=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit_s))
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS >= deadline )); then die "$what not ready after ${limit_s}s"; fi
    sleep 0.2
  done
}

APT_UPDATED="$STATE_DIR/.apt-updated"
apt_install() {
  command -v apt-get >/dev/null || die "apt-get not found: install $* by hand"
  [ "$(id -u)" = 0 ] || die "installing $* needs root (or install it yourself and re-run)"
  if [ ! -f "$APT_UPDATED" ]; then
    apt_update "$@"
  fi
  log "apt-get install $*"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  then
    # package lists from an earlier run may name versions the mirror no longer has
    log "apt-get install $* failed; updating the package lists and trying once more"
    apt_update "$@"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
      || die "apt-get install $* failed (above): check the network and apt sources, or install it yourself and re-run"
  fi
}
apt_update() {
  log "apt-get update"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
    || die "apt-get update failed (above), so $* cannot be installed: check the network and apt sources, or install it yourself and re-run"
  touch "$APT_UPDATED"
}

# mark_started NAME / started_by_us NAME / clear_started NAME: services-down stops only what
# services-up started, never a service that was already running.
mark_started() { touch "$STATE_DIR/$1.started"; }
started_by_us() { [ -f "$STATE_DIR/$1.started" ]; }
clear_started() { rm -f "$STATE_DIR/$1.started"; }

# wait_started NAME PIDFILE SECONDS PORT LOGHINT: wait until the process started in the
# background accepts connections on PORT and its own `ready` check passes; die naming LOGHINT if
# it exits or is not ready in time.
wait_started() {
  local name=$1 pidfile=$2 limit_s=$3 port=$4 hint=$5
  local deadline=$((SECONDS + limit_s))
  until port_open 127.0.0.1 "$port" && ready; do
    kill -0 "$(cat "$pidfile")" 2>/dev/null || die "$name exited at start (see $hint)"
    (( SECONDS < deadline )) || die "$name not ready after ${limit_s}s (see $hint)"
    sleep 0.25
  done
}

# stop_started NAME PIDFILE SECONDS: stop a service these scripts started (SIGTERM, SIGKILL after
# SECONDS); one that was already running is left alone.
stop_started() {
  local name=$1 pidfile=$2 limit_s=$3
  if started_by_us "$name" && [ -f "$pidfile" ]; then
    local pid
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + limit_s))
    while kill -0 "$pid" 2>/dev/null; do
      (( SECONDS < deadline )) || { kill -9 "$pid" 2>/dev/null || true; break; }
      sleep 0.2
    done
    clear_started "$name"
    log "$name stopped"
  else
    log "$name: not started by these scripts, left running"
  fi
}

# maven_fetch NAME POM LIBS: copy the runtime dependencies POM declares from Maven Central into
# LIBS (through LIBS.tmp, so an interrupted fetch is never taken for a finished one); installs
# Java and Maven first when they are missing. NAME labels the log line and the error.
maven_fetch() {
  local name=$1 pom=$2 libs=$3
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  command -v mvn >/dev/null || apt_install maven
  log "fetching $name and its dependencies from Maven Central into $libs"
  local tmp="$libs.tmp" mvn_log="$CACHE_DIR/${name%% *}-mvn.log"
  rm -rf "$tmp"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$tmp" >"$mvn_log" 2>&1 \
    || die "maven could not fetch $name (see $mvn_log)"
  mv "$tmp" "$libs"
}

# go_tool_build NAME VERSION PACKAGE BIN: build the Go command PACKAGE at VERSION once into BIN
# (in a scratch module under $CACHE_DIR, log in $CACHE_DIR/NAME-build.log); installs Go first
# when it is missing. Does nothing when BIN is already built.
go_tool_build() {
  local name=$1 version=$2 package=$3 bin=$4
  [ -x "$bin" ] && return
  command -v go >/dev/null || apt_install golang-go
  local scratch="$CACHE_DIR/$name-$version.build" build_log="$CACHE_DIR/$name-build.log"
  rm -rf "$scratch"; mkdir -p "$scratch"
  log "building $name $version from $package (several minutes)"
  (
    cd "$scratch"
    go mod init "pipeline.local/$name" >/dev/null 2>&1
    go get -tool "$package@$version"
    go build -trimpath -o "$name" "$package"
  ) >"$build_log" 2>&1 || die "$name build failed (see $build_log)"
  mkdir -p "$(dirname "$bin")"
  mv "$scratch/$name" "$bin"
  rm -rf "$scratch"
  log "$name $version built: $bin"
}
