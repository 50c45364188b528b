package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// interfaceAddr returns the address of the first interface of list
// (comma-separated names, hvdd serve --network-interface) that this host
// has with a usable address: its first IPv4 address that is not
// link-local, else its first global IPv6 address.
func interfaceAddr(list string) (string, error) {
	var tried []string
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			tried = append(tried, name+" (no such interface)")
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return "", fmt.Errorf("--network-interface %s: %w", name, err)
		}
		var v6 string
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.IsLinkLocalUnicast() {
				continue
			}
			if ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
			if v6 == "" {
				v6 = ipn.IP.String()
			}
		}
		if v6 != "" {
			return v6, nil
		}
		tried = append(tried, name+" (no address)")
	}
	if len(tried) == 0 {
		return "", errors.New("--network-interface is empty; name an interface, e.g. eth0")
	}
	return "", fmt.Errorf("--network-interface: none of %s can be used; this host has %s", strings.Join(tried, ", "), hostInterfaces())
}

// hostInterfaces lists this host's interfaces that are up, for messages.
func hostInterfaces() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return "no interface list (" + err.Error() + ")"
	}
	var names []string
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp != 0 {
			names = append(names, ifi.Name)
		}
	}
	return strings.Join(names, ", ")
}
