//go:build !cgo

package nvml

// cgoBuilt reports whether this build can load NVML (it needs cgo).
const cgoBuilt = false

// Discover, in a build without cgo, cannot load NVML: it returns a Report
// saying so, and the node runs CPU-only.
func Discover() (Report, error) {
	return Report{Reason: "built without cgo: no GPU discovery: CPU-only"}, nil
}
