// Package dl loads C libraries at run time and binds their functions to Go
// func fields, through purego (dlopen and a call bridge that need no cgo):
// gpu/cuda uses it for libcuda.so.1 and libnccl.so.2, so that hvdd builds
// without CUDA or its headers and runs without a GPU.
package dl

import (
	"errors"
	"reflect"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Open opens the first of paths that loads (RTLD_NOW|RTLD_GLOBAL),
// returning its handle and path, or the errors of all when none does.
func Open(paths []string) (uintptr, string, error) {
	var errs []error
	for _, p := range paths {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, p, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return 0, "", errors.New("no candidate path")
	}
	return 0, "", errors.Join(errs...)
}

// Close closes a handle Open returned.
func Close(handle uintptr) error { return purego.Dlclose(handle) }

// Bind fills the func fields of the struct lib points to with symbols of
// handle: each field's tag `sym:"a|b"` names the symbol, trying a, then b.
// Fields may be unexported. It returns the tags of the fields it found no
// symbol for (left nil).
func Bind(handle uintptr, lib any) (missing []string) {
	v := reflect.ValueOf(lib).Elem()
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("sym")
		if tag == "" {
			continue
		}
		var sym uintptr
		var err error
		for _, name := range strings.Split(tag, "|") {
			if sym, err = purego.Dlsym(handle, name); err == nil {
				break
			}
		}
		if err != nil {
			missing = append(missing, tag)
			continue
		}
		// Unexported fields are reached through their address.
		ptr := reflect.NewAt(f.Type, unsafe.Pointer(v.Field(i).UnsafeAddr()))
		purego.RegisterFunc(ptr.Interface(), sym)
	}
	return missing
}

// GoString copies the NUL-terminated C string at p ("" for nil).
func GoString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}
