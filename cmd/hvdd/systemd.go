package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
)

// systemdListener returns the socket systemd passed (socket activation through
// hvdd.socket: LISTEN_PID = our pid, LISTEN_FDS = 1, the socket at fd 3), or
// nil when none was passed.
func systemdListener() (*net.UnixListener, error) {
	if os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n < 1 {
		return nil, nil
	}
	if n != 1 {
		return nil, fmt.Errorf("systemd passed %d sockets; hvdd.socket should declare exactly one ListenStream", n)
	}
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_FDNAMES")
	f := os.NewFile(3, "systemd-socket")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("systemd socket: %w", err)
	}
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("systemd passed a %T, want a Unix stream socket", ln)
	}
	return ul, nil
}

// sdNotify sends a state line ("READY=1") to systemd when it supervises us
// with Type=notify; otherwise it does nothing.
func sdNotify(state string) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if path[0] == '@' {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return
	}
	defer c.Close()
	c.Write([]byte(state))
}
