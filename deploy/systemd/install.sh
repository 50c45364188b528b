#!/bin/sh
# Installs hvdd as a systemd service: the binary, hvdd.service and
# hvdd.socket, the hvdd system user and group, and /etc/default/hvdd.
# Idempotent: running it again (an upgrade) replaces the binary and the
# units, keeps /etc/default/hvdd, the user and the group, and restarts
# nothing (README.md, "Running hvdd as a service", says how to upgrade).
#
#   sudo deploy/systemd/install.sh              # bin/hvdd of this checkout
#   sudo HVDD_BIN=/path/to/hvdd deploy/systemd/install.sh
#   DESTDIR=/tmp/root deploy/systemd/install.sh # into a staging root (as root)
# On a node with NVIDIA GPUs (/dev/nvidiactl, or HVDD_GPU=1) it also
# installs hvdd-gpu.conf as hvdd.service.d/gpu.conf. NVIDIA MPS, for ranks
# sharing a GPU, is a separate unit: deploy/systemd/README-mps.md.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
bin=${HVDD_BIN:-$here/../../bin/hvdd}
root=${DESTDIR:-}

die() { echo "install.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: it writes /usr/local/bin and /etc and creates the hvdd user and group"
[ -x "$bin" ] || die "no hvdd binary at $bin: build it (go build -o bin/hvdd ./cmd/hvdd), or set HVDD_BIN"
"$bin" version >/dev/null 2>&1 || die "$bin does not run: is it built for this machine?"

# The group whose members may run jobs (hvdd.socket's SocketGroup=, hvdd
# serve --allow-gid hvdd), and the unprivileged user the daemon runs as.
# --prefix writes $DESTDIR/etc/group and passwd instead of the host's.
mkdir -p "$root/etc"
if ! grep -q '^hvdd:' "$root/etc/group" 2>/dev/null; then
	groupadd ${root:+--prefix "$root"} --system hvdd
	echo "created group hvdd: add users with: usermod -aG hvdd USER"
fi
if ! grep -q '^hvdd:' "$root/etc/passwd" 2>/dev/null; then
	useradd ${root:+--prefix "$root"} --system --gid hvdd --no-create-home \
		--home-dir /nonexistent --shell /usr/sbin/nologin --comment "hvdd daemon" hvdd
fi

# The binary: copied beside the old one, then renamed over it, so that a
# running daemon keeps its (old) executable and a crash meanwhile restarts
# the new one, never a half-written file.
install -d -m 0755 "$root/usr/local/bin"
install -m 0755 "$bin" "$root/usr/local/bin/.hvdd.new"
mv -f "$root/usr/local/bin/.hvdd.new" "$root/usr/local/bin/hvdd"

install -d -m 0755 "$root/etc/systemd/system"
install -m 0644 "$here/hvdd.service" "$here/hvdd.socket" "$root/etc/systemd/system/"
# A GPU node: the daemon needs the GPUs' device nodes (hvdd-gpu.conf).
if [ -e /dev/nvidiactl ] || [ "${HVDD_GPU:-}" = 1 ]; then
	install -D -m 0644 "$here/hvdd-gpu.conf" "$root/etc/systemd/system/hvdd.service.d/gpu.conf"
	echo "GPU node: installed hvdd.service.d/gpu.conf (the daemon sees /dev/nvidia*)"
fi
if [ ! -e "$root/etc/default/hvdd" ]; then
	install -D -m 0644 "$here/hvdd.default" "$root/etc/default/hvdd"
	echo "created /etc/default/hvdd: set HVDD_SLOTS there"
fi

if [ -z "$root" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	systemctl enable --now hvdd.socket
	if systemctl is-active --quiet hvdd.service; then
		echo "hvdd.service still runs the old binary: systemctl restart hvdd.service (it waits for a running job)"
	fi
	echo "installed: jobs connect to /run/hvdd/hvdd.sock (HVDD_SOCKET=/run/hvdd/hvdd.sock for users other than root)"
else
	echo "installed into ${root:-/}; systemd is not running there: on the target, run"
	echo "  systemctl daemon-reload && systemctl enable --now hvdd.socket"
fi
