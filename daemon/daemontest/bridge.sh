#!/usr/bin/env bash
# N test "nodes" on one switch: network namespaces PREFIXn0..PREFIXn<N-1>, each
# with one interface (veth0, address 10.77.0.<i+1>/24) whose peer is port
# <i> of a Linux bridge in a namespace of its own (PREFIXbr). Nothing is
# created in the root namespace, so interface names and addresses cannot
# collide with the machine's or with another group's; only the namespace
# names are global, and PREFIX keeps them apart.
#
# With RATE (a tc rate: 1gbit, 500mbit, ...), every link is limited to RATE
# in each direction by tc tbf: on veth0 (what the node sends) and on its
# bridge port (what it receives), as a full-duplex NIC of that speed.
#
# Used by daemontest.Bridge (embedded) and by bench/scale.sh:
#   bridge.sh up PREFIX N [RATE]   make the group (removing any leftover first)
#   bridge.sh rate PREFIX N RATE   change every link's limit (made with a rate)
#   bridge.sh down PREFIX N        kill what runs in it, delete it (idempotent)
# Needs root and iproute2.
set -euo pipefail
cmd=${1:?usage: bridge.sh up|rate|down PREFIX N [RATE]}
prefix=${2:?PREFIX missing}
n=${3:?N missing}
rate=${4:-}

down() {
  local ns
  for ns in "$prefix"br $(seq -f "${prefix}n%g" 0 $((n - 1))); do
    [ -e "/run/netns/$ns" ] || continue
    # Processes left inside (a daemon whose test died) would keep the
    # namespace alive after its name is gone.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}

# limit RATE: tbf at both ends of every link (add, or change a limit).
limit() {
  local i
  for i in $(seq 0 $((n - 1))); do
    # burst: at least rate/HZ and a few 64 KiB GSO segments.
    ip netns exec "${prefix}n$i" tc qdisc replace dev veth0 root tbf rate "$1" burst 1mb latency 10ms
    ip netns exec "${prefix}br" tc qdisc replace dev "port$i" root tbf rate "$1" burst 1mb latency 10ms
  done
}

case "$cmd" in
down) down ;;
rate) limit "${rate:?RATE missing}" ;;
up)
  down
  br="$prefix"br
  ip netns add "$br"
  ip -n "$br" link add br0 type bridge
  # No spanning tree, no learning delay: the ports forward at once.
  ip -n "$br" link set br0 type bridge stp_state 0 forward_delay 0
  ip -n "$br" link set lo up
  ip -n "$br" link set br0 up
  for i in $(seq 0 $((n - 1))); do
    ns="${prefix}n$i"
    ip netns add "$ns"
    ip link add veth0 netns "$ns" type veth peer name "port$i" netns "$br"
    ip -n "$br" link set "port$i" master br0
    ip -n "$br" link set "port$i" up
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev veth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set veth0 up
  done
  if [ -n "$rate" ]; then limit "$rate"; fi
  ;;
*)
  echo "bridge.sh: unknown command $cmd (want up, rate or down)" >&2
  exit 2
  ;;
esac
