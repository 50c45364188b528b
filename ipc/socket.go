package ipc

import (
	"os"
	"path/filepath"
	"strconv"
)

// DefaultSocket is the daemon's socket path when neither a flag nor
// $HVDD_SOCKET names one: /run/hvdd/hvdd.sock for root, else
// $XDG_RUNTIME_DIR/hvdd.sock, else $TMPDIR/hvdd-<uid>/hvdd.sock.
func DefaultSocket() string {
	if os.Geteuid() == 0 {
		return "/run/hvdd/hvdd.sock"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "hvdd.sock")
	}
	return filepath.Join(os.TempDir(), "hvdd-"+strconv.Itoa(os.Getuid()), "hvdd.sock")
}

// SocketPath resolves the socket path the way every hvdd command does:
// flagValue if non-empty, else $HVDD_SOCKET if non-empty, else DefaultSocket().
func SocketPath(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if s := os.Getenv("HVDD_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket()
}
