package backends

import (
	"math"
	"testing"
)

func TestParseCompression(t *testing.T) {
	tests := []struct {
		in   string
		want Compression
		ok   bool
	}{
		{"", CompressNone, true},
		{"none", CompressNone, true},
		{"fp16", CompressFP16, true},
		{"BF16", CompressBF16, true},
		{" bf16 ", CompressBF16, true},
		{"float16", 0, false},
		{"int8", 0, false},
	}
	for _, tc := range tests {
		got, err := ParseCompression(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseCompression(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok {
			if back, err := ParseCompression(got.String()); err != nil || back != got {
				t.Errorf("%v does not round-trip through its String: %v, %v", got, back, err)
			}
		}
	}
	if Compression(7).Valid() || Compression(7).String() != "Compression(7)" {
		t.Errorf("Compression(7): Valid %v, String %q", Compression(7).Valid(), Compression(7).String())
	}
}

// TestErrorBound checks the bound against its first-order form n·u·Σ|x|
// (the higher-order terms are below 1% of it for the rank counts a job
// has) and its absolute term on zero inputs.
func TestErrorBound(t *testing.T) {
	for _, c := range []struct {
		c      Compression
		u, eta float64
	}{{CompressFP16, 0x1p-11, 0x1p-25}, {CompressBF16, 0x1p-8, 0x1p-134}} {
		for _, n := range []int{2, 3, 8, 16} {
			got := c.c.ErrorBound(n, 1)
			first := float64(n)*c.u + float64(n-1)*0x1p-24
			if got < first || got > first*1.07 {
				t.Errorf("%v n=%d: bound %g, first-order %g", c.c, n, got, first)
			}
			if z := c.c.ErrorBound(n, 0); z < float64(2*n-1)*c.eta || z > float64(2*n-1)*c.eta*1.1 {
				t.Errorf("%v n=%d: bound on zero inputs %g, want about %g", c.c, n, z, float64(2*n-1)*c.eta)
			}
		}
	}
	if b := CompressNone.ErrorBound(4, 1); b != 0 {
		t.Errorf("CompressNone bound %g", b)
	}
	if !(math.Abs(CompressFP16.ErrorBound(2, 1)-9.77e-4) < 1e-5) {
		t.Errorf("fp16 n=2 bound %g, documented as 9.8e-4", CompressFP16.ErrorBound(2, 1))
	}
}
