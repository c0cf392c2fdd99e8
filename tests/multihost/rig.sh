#!/usr/bin/env bash
# Separate hosts on one machine, for tests that cross hosts (as root).
#   rig.sh up DIR N [KEEP...]
#                       hosts h1..hN: each its own network namespace (a veth on
#                       a private bridge, 10.R.0.i/24), hostname (UTS), IPC and
#                       /dev/shm (no shared memory between hosts) and /tmp
#                       (mount namespace); DIR/shared is the one directory all
#                       hosts see (a shared filesystem). Writes DIR/agent (the
#                       rsh agent OpenMPI uses instead of ssh) and DIR/mca.env.
#                       KEEP: directories under /tmp every host still sees at
#                       their own path (a checkout and its build, like a shared
#                       home on a cluster); the rest of /tmp is the host's own.
#   rig.sh exec DIR HOST CMD...   run CMD on HOST (as mpirun would be run on a login node)
#   rig.sh down DIR     remove everything `up` made (also after a partial `up`)
# DIR must not be under /tmp (each host mounts its own /tmp); use /run/...
set -euo pipefail

die() { echo "rig: $*" >&2; exit 2; }

up() {
  local dir=$1 n=$2
  shift 2
  local keep=""
  for k in "$@"; do
    k=$(realpath -m "$k")
    [[ $k == /tmp/* ]] && keep+=" '${k#/tmp/}'"
  done
  [[ $(id -u) == 0 ]] || die "needs root (network, UTS, IPC and mount namespaces)"
  [[ $dir != /tmp/* ]] || die "DIR must not be under /tmp (each host has its own /tmp)"
  mkdir -p "$dir/shared"
  # A short id for interface names (15 characters at most) and a subnet.
  local id=$(( $$ % 200 + 20 ))
  echo "$id" >"$dir/id"
  local br="dcb$id"
  ip link add "$br" type bridge
  ip link set "$br" up
  : >"$dir/hosts"
  printf '127.0.0.1 localhost\n' >>"$dir/hosts"
  for ((i = 1; i <= n; i++)); do printf '10.%d.0.%d h%d\n' "$id" "$i" "$i" >>"$dir/hosts"; done
  for ((i = 1; i <= n; i++)); do
    local ns="dc${id}h$i" veth="dcv${id}h$i"
    ip netns add "$ns"
    echo "$ns" >>"$dir/netns"
    ip link add "$veth" type veth peer name "${veth}p"
    ip link set "${veth}p" netns "$ns"
    ip link set "$veth" master "$br" up
    ip netns exec "$ns" ip link set "${veth}p" name eth0
    ip netns exec "$ns" ip addr add "10.$id.0.$i/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    # The host's holder process keeps its UTS, IPC and mount namespaces. The
    # machine's /tmp stays reachable at DIR/tmp.hI for the KEEP directories.
    mkdir -p "$dir/tmp.h$i"
    ip netns exec "$ns" unshare --uts --ipc --mount --propagation private -- /bin/sh -c "
      hostname h$i
      mount --bind /tmp '$dir/tmp.h$i'
      mount -t tmpfs -o size=4g tmpfs /tmp
      for k in $keep; do mkdir -p \"/tmp/\$k\" && mount --bind \"$dir/tmp.h$i/\$k\" \"/tmp/\$k\"; done
      mount -t tmpfs -o size=1g tmpfs /dev/shm
      mount --bind '$dir/hosts' /etc/hosts
      echo \$\$ > '$dir/h$i.pid'
      exec sleep infinity" </dev/null >/dev/null 2>&1 &
  done
  for ((i = 1; i <= n; i++)); do
    for _ in $(seq 100); do [[ -s $dir/h$i.pid ]] && break; sleep 0.05; done
    [[ -s $dir/h$i.pid ]] || die "host h$i did not start"
  done
  # ssh for OpenMPI: "agent [options] HOST COMMAND" runs COMMAND on HOST.
  cat >"$dir/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
pid=\$(cat "$dir/\$host.pid" 2>/dev/null) || { echo "rig agent: no host '\$host'" >&2; exit 255; }
exec nsenter -t "\$pid" -n -u -i -m -- /bin/sh -c "\$*"
AGENT
  chmod +x "$dir/agent"
  cat >"$dir/mca.env" <<ENV
export OMPI_MCA_plm_rsh_agent=$dir/agent
export OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=10.$id.0.0/24
export OMPI_MCA_oob_tcp_if_include=10.$id.0.0/24
# The hosts share this machine's cores, which OpenMPI cannot know from
# --host h1:8: without yielding, 16 ranks spin on 2 cores (3x slower).
export OMPI_MCA_mpi_yield_when_idle=1
ENV
}

run_on() {
  local dir=$1 host=$2
  shift 2
  local pid
  pid=$(cat "$dir/$host.pid" 2>/dev/null) || die "no host '$host' in $dir"
  nsenter -t "$pid" -n -u -i -m --wd="$PWD" -- "$@"
}

down() {
  local dir=$1
  [[ -d $dir ]] || return 0
  for f in "$dir"/h*.pid; do
    [[ -e $f ]] || continue
    local pid
    pid=$(cat "$f")
    # Everything still running on the host (mpirun, orted, ranks), then its holder.
    for p in $(ip netns pids "$(cat "$dir/netns" | sed -n "$(basename "$f" .pid | tr -d h)p")" 2>/dev/null); do
      kill -9 "$p" 2>/dev/null || true
    done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [[ -f $dir/netns ]]; then
    while read -r ns; do ip netns del "$ns" 2>/dev/null || true; done <"$dir/netns"
  fi
  if [[ -f $dir/id ]]; then
    local id
    id=$(cat "$dir/id")
    for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^dc(v${id}h[0-9]+|b${id})$"); do
      ip link del "$l" 2>/dev/null || true
    done
  fi
  # The tmp.hI directories were mount points inside the hosts only: rmdir,
  # never rm -r, so a mount seen from here could not take /tmp with it.
  rmdir "$dir"/tmp.h* 2>/dev/null || true
  rm -rf "$dir/shared"
  rm -f "$dir"/agent "$dir"/mca.env "$dir"/hosts "$dir"/netns "$dir"/id "$dir"/h*.pid
  rmdir "$dir" 2>/dev/null || echo "rig: $dir not empty, left in place" >&2
}

case ${1:-} in
  up) [[ $# -ge 3 ]] || die "usage: rig.sh up DIR N [KEEP...]"; shift; up "$@" ;;
  exec) [[ $# -ge 4 ]] || die "usage: rig.sh exec DIR HOST CMD..."; shift; run_on "$@" ;;
  down) [[ $# == 2 ]] || die "usage: rig.sh down DIR"; down "$2" ;;
  *) die "usage: rig.sh up DIR N [KEEP...] | exec DIR HOST CMD... | down DIR" ;;
esac
