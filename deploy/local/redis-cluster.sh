#!/usr/bin/env bash
# A 3-node Redis Cluster (no replicas) on 127.0.0.1:7000-7002 for the throttle's cluster test.
# Ports override with REDIS_CLUSTER_PORTS="7000 7001 7002". Usage: redis-cluster.sh up|down|status
source "$(dirname "$0")/common.sh"
read -r -a PORTS <<< "${REDIS_CLUSTER_PORTS:-7000 7001 7002}"
DIR="$STATE_DIR/redis-cluster"

ping() { redis-cli -h 127.0.0.1 -p "$1" ping | grep -q PONG; }
cluster_ok() { redis-cli -h 127.0.0.1 -p "${PORTS[0]}" cluster info | grep -q 'cluster_state:ok'; }
all_open() { for p in "${PORTS[@]}"; do port_open 127.0.0.1 "$p" || return 1; done; }

up() {
  command -v redis-server >/dev/null || apt_install redis-server redis-tools
  if all_open && cluster_ok; then
    log "redis cluster already running on 127.0.0.1:${PORTS[*]} (left as it is)"
    return
  fi
  for p in "${PORTS[@]}"; do
    if port_open 127.0.0.1 "$p"; then continue; fi
    mkdir -p "$DIR/$p"
    # No persistence: the cluster is scratch space for tests. A stale nodes.conf from an earlier
    # run would make the node remember a cluster that no longer exists.
    rm -f "$DIR/$p/nodes.conf"
    redis-server --bind 127.0.0.1 --port "$p" --daemonize yes --cluster-enabled yes \
      --cluster-config-file "$DIR/$p/nodes.conf" --cluster-node-timeout 5000 \
      --dir "$DIR/$p" --pidfile "$DIR/$p/redis.pid" --logfile "$DIR/$p/redis.log" \
      --appendonly no --save ""
    wait_until 30 "redis cluster node 127.0.0.1:$p" ping "$p"
  done
  mark_started redis-cluster
  if ! cluster_ok; then
    local nodes=()
    for p in "${PORTS[@]}"; do nodes+=("127.0.0.1:$p"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
  fi
  wait_until 30 "redis cluster state ok" cluster_ok
  log "redis cluster ready on 127.0.0.1:${PORTS[*]}"
}

down() {
  if started_by_us redis-cluster; then
    for p in "${PORTS[@]}"; do
      redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true
    done
    clear_started redis-cluster
    log "redis cluster stopped"
  else
    log "redis cluster: not started by these scripts, left running"
  fi
}

status() {
  if all_open && cluster_ok; then echo "redis-cluster redis://127.0.0.1:${PORTS[0]} (3 nodes)"
  else echo "redis-cluster down"; fi
}

"${1:-up}"
