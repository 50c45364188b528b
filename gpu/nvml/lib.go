//go:build cgo

package nvml

import (
	"os"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The NVML binding is github.com/NVIDIA/go-nvml: cgo against nvml.h, with
// every NVML symbol left unresolved at link time and libnvidia-ml.so.1
// opened with dlopen(RTLD_GLOBAL) by Init, so that the binary builds
// without the CUDA toolkit and runs without the driver. Discovery and the
// sampler run on its Interface; the tests run them on its generated mocks
// (pkg/nvml/mock).
//
// A function the loaded library lacks is not an error go-nvml can return:
// the dynamic linker resolves it at the first call and aborts the process
// when it cannot. NVML keeps its functions across driver releases and
// hvdd calls long-standing ones; the sampler still looks up the ones a
// driver may lack before it calls them (openSampler, eventSymbols).

// libraryPath is the path libnvidia-ml.so.1 is opened from:
// HVDD_NVML_LIBRARY if set (the tests point it at testdata/stub.c built
// into a library), else the name alone, for the dynamic linker's search.
func libraryPath() string {
	if p := os.Getenv("HVDD_NVML_LIBRARY"); p != "" {
		return p
	}
	return "libnvidia-ml.so.1"
}

// libraries holds one go-nvml library per path, shared by Discover and
// every Sampler: go-nvml counts Init and Shutdown per library and loads
// and unloads it under its own lock, and its package state (the error
// string function, the versioned symbols) belongs to the one library
// loaded, so two instances of one path must not load and unload
// independently.
var libraries struct {
	mu sync.Mutex // guards m
	m  map[string]gonvml.Interface
}

// newLibrary returns the library at libraryPath, not loaded until its Init.
func newLibrary() gonvml.Interface {
	p := libraryPath()
	libraries.mu.Lock()
	defer libraries.mu.Unlock()
	if l, ok := libraries.m[p]; ok {
		return l
	}
	if libraries.m == nil {
		libraries.m = make(map[string]gonvml.Interface)
	}
	l := gonvml.New(gonvml.WithLibraryPath(p))
	libraries.m[p] = l
	return l
}
