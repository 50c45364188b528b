# Sourced by the two-"node" benchmarks (netbench.sh, netab.sh): makes network
# namespaces ${NS}0 and ${NS}1 joined by a veth pair, addresses $A and $B
# (optionally the link limited to $RATE, default 10gbit, by tc tbf when TBF=1), and
# $W/agent, the remote agent with which hvdd run and mpirun reach them. The
# caller sets NS, A, B, TBF and W and removes the namespaces on exit
# (netns_cleanup).
netns_cleanup() { ip netns del "${NS}0" 2>/dev/null || true; ip netns del "${NS}1" 2>/dev/null || true; rm -rf "$W"; }
netns_cleanup; mkdir -p "$W"
ip netns add "${NS}0"; ip netns add "${NS}1"
ip link add "${NS}0i" netns "${NS}0" type veth peer name "${NS}1i" netns "${NS}1"
ip -n "${NS}0" addr add "$A/24" dev "${NS}0i"; ip -n "${NS}1" addr add "$B/24" dev "${NS}1i"
for n in "${NS}0" "${NS}1"; do ip -n "$n" link set lo up; ip -n "$n" link set "${n}i" up; done
if [ "${TBF:-0}" = 1 ]; then
  for n in "${NS}0" "${NS}1"; do ip netns exec "$n" tc qdisc add dev "${n}i" root tbf rate "${RATE:-10gbit}" burst 1mb latency 10ms; done
fi
cat > "$W/agent" <<AGENT
#!/bin/sh
# hvdd run / mpirun remote agent: run the command in the host's namespace.
host=\$1; shift
case "\$host" in $A|${NS}0) ns=${NS}0 ;; $B|${NS}1) ns=${NS}1 ;; *) echo "unknown host \$host" >&2; exit 255 ;; esac
# The namespaces share one file system: an Open MPI session directory each.
OMPI_MCA_orte_tmpdir_base=$W/ompi-\$ns; export OMPI_MCA_orte_tmpdir_base
mkdir -p "\$OMPI_MCA_orte_tmpdir_base"
exec ip netns exec \$ns sh -c "\$*"
AGENT
chmod +x "$W/agent"
