package kernels

import (
	"bytes"
	"encoding/binary"
	"regexp"
	"slices"
	"strings"
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
	// 11 dtypes x 4 ops of reduce and of combine, 10 scales (no bool), 4
	// conversions.
	if want := 11*4*2 + 10 + 4; len(cat) != want {
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
	for _, tt := range tests {
		want := strings.Replace(tt.want, "reduce_", "combine_", 1)
		got, err := CombineName(tt.op, tt.dt)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("CombineName(%v, %v) = %q, %v; want %q", tt.op, tt.dt, got, err, want)
		}
		if got != "" {
			k, ok := Lookup(got)
			if !ok || k.Kind != Combine || k.Op != tt.op || k.DType != tt.dt || !slices.Equal(k.Params, []Param{Ptr, U64, U64, U64, F64, F64}) {
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

// TestCatalogKinds checks that every (op, dtype) has its reduce and its
// combine kernel, and every kernel a kind it is named after.
func TestCatalogKinds(t *testing.T) {
	n := map[Kind]int{}
	for _, k := range Catalog() {
		n[k.Kind]++
		prefix := map[Kind]string{Reduce: "reduce_", Scale: "scale_", Convert: "convert_", Combine: "combine_"}[k.Kind]
		if prefix == "" || !strings.HasPrefix(k.Name, prefix) {
			t.Errorf("%s: kind %d", k.Name, k.Kind)
		}
	}
	if n[Reduce] != 44 || n[Combine] != 44 || n[Scale] != 10 || n[Convert] != 4 {
		t.Errorf("kernels of each kind: %v", n)
	}
	for _, dt := range kernelDTypes {
		for _, o := range opNames {
			if _, err := CombineName(o.op, dt); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestCombineVectors checks that exactly the combine kernels the package
// doc says move 16 bytes at a time (float32, float16, bfloat16) have
// 16-byte loads and stores, and no other kernel has any.
func TestCombineVectors(t *testing.T) {
	body := regexp.MustCompile(`(?s)\.visible \.entry (\w+)\(.*?\n\}\n`)
	vectored := map[tensor.DType]bool{tensor.Float32: true, tensor.Float16: true, tensor.BFloat16: true}
	n := 0
	for _, m := range body.FindAllSubmatch(PTX(), -1) {
		k, ok := Lookup(string(m[1]))
		if !ok {
			t.Fatalf("%s: not in the catalogue", m[1])
		}
		n++
		ld := bytes.Contains(m[0], []byte("ld.global.v4.u32"))
		st := bytes.Contains(m[0], []byte("st.global.v4.u32"))
		want := k.Kind == Combine && vectored[k.DType]
		if ld != want || st != want {
			t.Errorf("%s: 16-byte loads %v, stores %v; want %v", k.Name, ld, st, want)
		}
	}
	if n != len(Catalog()) {
		t.Errorf("%d kernels in the PTX, %d in the catalogue", n, len(Catalog()))
	}
}

func TestAppendTable(t *testing.T) {
	b := AppendTable([]byte{0xaa}, Segment{Count: 3, In: []uint64{0x1000, 0x2000}, Out: []uint64{0x1000, 0x2000}})
	b = AppendTable(b, Segment{Count: 1 << 40, In: []uint64{1, 2}, Out: []uint64{3, 4}})
	b = AppendTable(b, Segment{}) // a count only
	if len(b) != 1+2*5*8+8 {
		t.Fatalf("%d bytes, want %d", len(b), 1+2*5*8+8)
	}
	if b[0] != 0xaa {
		t.Error("the prefix changed")
	}
	want := []uint64{3, 0x1000, 0x2000, 0x1000, 0x2000, 1 << 40, 1, 2, 3, 4, 0}
	for i, w := range want {
		if got := binary.LittleEndian.Uint64(b[1+8*i:]); got != w {
			t.Errorf("word %d = %#x, want %#x", i, got, w)
		}
	}
}

// TestCombineGrid: a thread per 16-byte vector for the vectorized dtypes,
// a thread per element for the others.
func TestCombineGrid(t *testing.T) {
	for _, tc := range []struct {
		n    int
		dt   tensor.DType
		want int
	}{
		{1, tensor.Float32, 1},
		{4 * BlockSize, tensor.Float32, 1},
		{4*BlockSize + 1, tensor.Float32, 2},
		{8 * BlockSize * 3, tensor.Float16, 3},
		{8 * BlockSize * 3, tensor.BFloat16, 3},
		{BlockSize * 3, tensor.Int32, 3},
		{BlockSize * 3, tensor.Float64, 3},
		{1 << 40, tensor.Float32, MaxGrid},
	} {
		if got := CombineGrid(tc.n, tc.dt); got != tc.want {
			t.Errorf("CombineGrid(%d, %v) = %d, want %d", tc.n, tc.dt, got, tc.want)
		}
	}
}
