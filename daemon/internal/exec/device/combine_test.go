package device

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"testing"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/gpu/kernels"
	"github.com/hvdd/hvdd/tensor"
)

// TestCombineTables: a combine launch with a table seen before copies
// nothing (the table stays in the GPU's table area), and still computes the
// sum; a new table is copied; a full area is replaced, and the next
// launches still compute right.
func TestCombineTables(t *testing.T) {
	g := OpenGPUs(fake.New(fake.Options{Devices: 1}), nil, slog.New(slog.NewTextHandler(io.Discard, nil)), false)
	defer g.Close()
	d := g.devs[0]
	if err := d.open("test"); err != nil {
		t.Fatal(err)
	}
	const n = 100
	bufs := make([]gpu.DevicePtr, 4)
	for i := range bufs {
		p, err := d.dev.Alloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		defer d.dev.Free(p)
		bufs[i] = p
	}
	fill := func(p gpu.DevicePtr, v float32) {
		b := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		if err := d.dev.CopyHtoD(d.stream, p, b); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, p gpu.DevicePtr, want float32) {
		t.Helper()
		b := make([]byte, 4*n)
		if err := d.dev.CopyDtoH(d.stream, b, p); err != nil {
			t.Fatal(err)
		}
		if err := d.sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		d.endResponse()
		for i := range n {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])); got != want {
				t.Fatalf("%s: element %d = %v, want %v", what, i, got, want)
			}
		}
	}
	sum := func(in ...gpu.DevicePtr) []kernels.Segment {
		ps := make([]uint64, len(in))
		for i, p := range in {
			ps[i] = uint64(p)
		}
		return []kernels.Segment{{Count: n, In: ps, Out: ps}}
	}
	fill(bufs[0], 1)
	fill(bufs[1], 2)
	if err := d.combine(sum(bufs[0], bufs[1]), 2, 2, tensor.Float32, tensor.Sum, 1, 1); err != nil {
		t.Fatal(err)
	}
	check("first launch", bufs[1], 3)
	used, area := d.tab.used, d.tab.dev
	if used == 0 {
		t.Fatal("the first table took no room in the table area")
	}
	fill(bufs[0], 1)
	fill(bufs[1], 2)
	if err := d.combine(sum(bufs[0], bufs[1]), 2, 2, tensor.Float32, tensor.Sum, 0.5, 4); err != nil {
		t.Fatal(err)
	}
	check("same table", bufs[0], 6)
	if d.tab.used != used || d.tab.dev != area {
		t.Fatalf("the same table again: area %x used %d, was %x %d (copied again)", d.tab.dev, d.tab.used, area, used)
	}
	fill(bufs[2], 5)
	if err := d.combine(sum(bufs[0], bufs[2]), 2, 2, tensor.Float32, tensor.Sum, 1, 1); err != nil {
		t.Fatal(err)
	}
	check("new table", bufs[2], 11)
	if d.tab.used <= used {
		t.Fatalf("a new table took no room: used %d, was %d", d.tab.used, used)
	}
	// Fill the area with distinct tables until it is replaced.
	for i := 0; d.tab.dev == area; i++ {
		if i > maxTable/256 {
			t.Fatal("the table area never filled up")
		}
		fill(bufs[3], float32(i))
		segs := sum(bufs[3])
		segs[0].Count = uint64(1 + i%(n-1))
		segs[0].In = append(segs[0].In, uint64(bufs[3])+uint64(4*(i/n%2)))
		if err := d.combine(segs, 2, 1, tensor.Float32, tensor.Max, 1, 1); err != nil {
			t.Fatal(err)
		}
		if err := d.sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		d.endResponse()
	}
	fill(bufs[0], 1)
	fill(bufs[1], 2)
	if err := d.combine(sum(bufs[0], bufs[1]), 2, 2, tensor.Float32, tensor.Sum, 1, 1); err != nil {
		t.Fatal(err)
	}
	check("after the area was replaced", bufs[1], 3)
}
