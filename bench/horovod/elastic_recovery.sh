#!/usr/bin/env bash
# Elastic recovery, hvdd against Horovod 0.28.1, alternated per round: from a
# worker's SIGKILL (or exception) to the survivors' first training step completed at the new
# size (clients/python/bench/tf_elastic_worker.py: 3 ranks, the last killed at
# step 3, TensorFlowKerasState + DistributedGradientTape).
#   hvdd     hvdd run -np 3 --min-np 2 (one host; TF 2.21)
#   hvdd-3h  the same on three "hosts" as Horovod's, a daemon each on
#            127.0.0.2, 127.0.0.3 and 127.0.0.4 (1 rank each, the victim on
#            the last): the failed worker's host is blacklisted, and the
#            next epoch spans the other two, its tcp engine connected anew
#   horovod  horovodrun -np 3 --min-np 2 --host-discovery-script (hosts
#            127.0.0.1:1, 127.0.0.2:1, 127.0.0.3:1; the Horovod TF venv, TF 2.15)
# Horovod blacklists the host of a failed worker, so its three ranks run on
# three loopback "hosts", which it reaches over ssh: the script runs an sshd
# of its own on them (a free port, keys made for the run; openssh-server,
# which scripts/setup.sh installs) and passes horovodrun -p and -i.
#
#   bench/horovod/setup_tf.sh                # once: the Horovod + TensorFlow venv
#   bench/horovod/elastic_recovery.sh [ROUNDS] [kill|raise]   # default 3 kill
# With raise the victim raises an exception at the step instead of SIGKILL
# (its process exits with status 1 through Python's exit path).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${HOROVOD_TF_VENV:-$(dirname "$REPO")/hvd-tf-venv}"
ROUNDS="${1:-3}"
export HVDD_BENCH_EXIT="${2:-kill}"
case "$HVDD_BENCH_EXIT" in kill|raise) ;; *) echo "usage: $0 [ROUNDS] [kill|raise]" >&2; exit 2;; esac
WORKER="$REPO/clients/python/bench/tf_elastic_worker.py"
[ -x "$VENV/bin/horovodrun" ] || { echo "no Horovod venv at $VENV: run bench/horovod/setup_tf.sh" >&2; exit 1; }
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || { echo "sshd missing: apt-get install openssh-server (scripts/setup.sh does)" >&2; exit 1; }
go build -o "$REPO/bin/hvdd" "$REPO/cmd/hvdd"
TMP=$(mktemp -d)
trap '[ -f "$TMP/sshd.pid" ] && kill "$(cat "$TMP/sshd.pid")" 2>/dev/null; rm -rf "$TMP"' EXIT
# An sshd for the loopback hosts, as launch/ssh_test.go runs one.
ssh-keygen -q -t ed25519 -N "" -f "$TMP/host_ed25519"
ssh-keygen -q -t ed25519 -N "" -f "$TMP/id_ed25519"
cp "$TMP/id_ed25519.pub" "$TMP/authorized_keys"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
{
  for h in 127.0.0.1 127.0.0.2 127.0.0.3; do echo "ListenAddress $h:$PORT"; done
  printf 'HostKey %s\nAuthorizedKeysFile %s\nPidFile %s\nStrictModes no\nUsePAM no\n' \
    "$TMP/host_ed25519" "$TMP/authorized_keys" "$TMP/sshd.pid"
  printf 'PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n'
} > "$TMP/sshd_config"
mkdir -p /run/sshd
"$SSHD" -f "$TMP/sshd_config" -E "$TMP/sshd.log"
for h in 127.0.0.2 127.0.0.3; do
  for _ in $(seq 50); do
    ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
      -p "$PORT" -i "$TMP/id_ed25519" "$h" true 2>/dev/null && continue 2
    sleep 0.1 # sshd starting: nothing to wait on but its port
  done
  echo "ssh $h:$PORT fails; sshd's log:" >&2; cat "$TMP/sshd.log" >&2; exit 1
done
printf '#!/bin/sh\necho 127.0.0.1:1\necho 127.0.0.2:1\necho 127.0.0.3:1\n' > "$TMP/discover.sh"; chmod +x "$TMP/discover.sh"
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
recovery() { # log -> seconds
  python3 -c 'import sys
t=sys.stdin.read().splitlines()
k=[float(l.split("KILL ")[1]) for l in t if "KILL " in l]
r=[float(l.split("RECOVERED ")[1].split()[0]) for l in t if "RECOVERED " in l]
print(f"{max(r)-k[0]:.3f}" if len(k)==1 and len(r)==2 else "failed")' < "$1"
}
for r in $(seq 1 "$ROUNDS"); do
  "$REPO/bin/hvdd" run -np 3 --min-np 2 --socket "$TMP/hvdd.sock" -- "$REPO/.venv/bin/python" "$WORKER" 8 3 > "$TMP/hvdd.$r.log" 2>&1 || true
  echo "round $r hvdd recovery_s=$(recovery "$TMP/hvdd.$r.log")"
  "$REPO/bin/hvdd" run -np 3 --min-np 2 -H 127.0.0.2:1,127.0.0.3:1,127.0.0.4:1 -- "$REPO/.venv/bin/python" "$WORKER" 8 3 > "$TMP/hvdd3h.$r.log" 2>&1 || true
  echo "round $r hvdd-3h recovery_s=$(recovery "$TMP/hvdd3h.$r.log")"
  (cd "$TMP" && HVDD_BENCH_IMPL=horovod "$VENV/bin/horovodrun" -np 3 --min-np 2 --host-discovery-script "$TMP/discover.sh" \
     -p "$PORT" -i "$TMP/id_ed25519" --network-interface lo "$VENV/bin/python" "$WORKER" 8 3) > "$TMP/horovod.$r.log" 2>&1 || true
  echo "round $r horovod recovery_s=$(recovery "$TMP/horovod.$r.log")"
done
