package loop

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// peerGroups returns the supplementary groups of the process on the other
// end of a Unix socket (SO_PEERGROUPS, Linux 4.13: the groups it had when
// it connected). SO_PEERCRED gives only the primary group, and a user
// added to a group (usermod -aG hvdd alice) has it as a supplementary one:
// that is how the socket file's group lets them connect, and how
// Config.AllowGIDs must let them in too.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]byte, 64*4)
	for {
		n := uint32(len(buf))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case errno == unix.ERANGE && int(n) > len(buf):
			buf = make([]byte, n) // n is the size needed
			continue
		case errno != 0:
			return nil, fmt.Errorf("daemon: SO_PEERGROUPS: %w", errno)
		}
		gids := make([]uint32, n/4)
		for i := range gids {
			gids[i] = binary.NativeEndian.Uint32(buf[4*i:])
		}
		return gids, nil
	}
}
