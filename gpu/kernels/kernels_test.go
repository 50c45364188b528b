package kernels

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

// TestCatalogMatchesPTX checks that the embedded image has exactly the
// catalogue's entries, each with its parameters.
func TestCatalogMatchesPTX(t *testing.T) {
	img := PTX()
	if len(img) == 0 || img[len(img)-1] != 0 || bytes.IndexByte(img, 0) != len(img)-1 {
		t.Fatal("PTX() is not one NUL-terminated string")
	}
	re := regexp.MustCompile(`\.visible \.entry (\w+)\(\n((?:\t\.param [^\n]*\n)*)\)`)
	entries := map[string]string{}
	for _, m := range re.FindAllSubmatch(img, -1) {
		entries[string(m[1])] = string(m[2])
	}
	cat := Catalog()
	// 11 dtypes x 4 ops, 10 scales (no bool), 4 conversions.
	if want := 11*4 + 10 + 4; len(cat) != want {
		t.Errorf("%d kernels in the catalogue, want %d", len(cat), want)
	}
	if len(entries) != len(cat) {
		t.Errorf("%d entries in the PTX, %d kernels in the catalogue", len(entries), len(cat))
	}
	for _, k := range cat {
		params, ok := entries[k.Name]
		if !ok {
			t.Errorf("%s: not in the PTX", k.Name)
			continue
		}
		want := ""
		for _, p := range k.Params {
			want += map[Param]string{Ptr: ".u64", U64: ".u64", F64: ".f64"}[p]
		}
		got := ""
		for _, m := range regexp.MustCompile(`\.param (\.\w+)`).FindAllStringSubmatch(params, -1) {
			got += m[1]
		}
		if got != want {
			t.Errorf("%s: parameters %s in the PTX, %s in the catalogue", k.Name, got, want)
		}
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		op   tensor.ReduceOp
		dt   tensor.DType
		want string
	}{
		{tensor.Sum, tensor.Float32, "reduce_sum_float32"},
		{tensor.Product, tensor.BFloat16, "reduce_prod_bfloat16"},
		{tensor.Min, tensor.Bool, "reduce_min_bool"},
		{tensor.Max, tensor.Uint16, "reduce_max_uint16"},
		{tensor.Average, tensor.Float32, ""},
		{tensor.Adasum, tensor.Float32, ""},
		{tensor.Sum, tensor.Invalid, ""},
	}
	for _, tt := range tests {
		got, err := Name(tt.op, tt.dt)
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("Name(%v, %v) = %q, %v; want %q", tt.op, tt.dt, got, err, tt.want)
		}
		if got != "" {
			if k, ok := Lookup(got); !ok || k.Kind != Reduce || k.Op != tt.op || k.DType != tt.dt {
				t.Errorf("Lookup(%q) = %+v, %v", got, k, ok)
			}
		}
	}
	if n, err := ScaleName(tensor.Float16); n != "scale_float16" || err != nil {
		t.Errorf("ScaleName(float16) = %q, %v", n, err)
	}
	if n, err := ScaleName(tensor.Bool); err == nil {
		t.Errorf("ScaleName(bool) = %q, want an error", n)
	}
	if k, ok := Lookup(ConvertName(tensor.Float32, tensor.BFloat16)); !ok || k.Kind != Convert || k.To != tensor.BFloat16 {
		t.Errorf("the float32 -> bfloat16 conversion: %+v, %v", k, ok)
	}
	for _, c := range []struct{ n, want int }{{0, 1}, {1, 1}, {256, 1}, {257, 2}, {1 << 30, MaxGrid}} {
		if g := Grid(c.n); g != c.want {
			t.Errorf("Grid(%d) = %d, want %d", c.n, g, c.want)
		}
	}
}
