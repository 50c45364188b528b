package main

import (
	"strings"
	"testing"
)

func TestInterfaceAddr(t *testing.T) {
	tests := []struct {
		list, want, wantErr string
	}{
		{list: "lo", want: "127.0.0.1"},
		{list: "hvdd-none0,lo", want: "127.0.0.1"}, // the first one this host has
		{list: " lo ,", want: "127.0.0.1"},
		{list: "hvdd-none0", wantErr: "none of hvdd-none0 (no such interface) can be used; this host has lo"},
		{list: ",", wantErr: "--network-interface is empty"},
	}
	for _, tt := range tests {
		got, err := interfaceAddr(tt.list)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("interfaceAddr(%q) = %q, %v; want an error containing %q", tt.list, got, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("interfaceAddr(%q) = %q, %v; want %q", tt.list, got, err, tt.want)
		}
	}
}
