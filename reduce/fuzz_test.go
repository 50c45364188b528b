package reduce

import (
	"bytes"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

// FuzzReduce checks Reduce against refReduce on fuzzer-chosen bytes: sel
// picks the dtype, op, source count, aliasing, scale factors and options,
// data supplies the source elements. Any input must either be rejected with
// an error or reduce exactly like the reference.
func FuzzReduce(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), uint64(0))
	f.Add(bytes.Repeat([]byte{0x7f, 0xc0, 0, 0, 0x80, 0, 0, 0}, 40), uint64(8|1<<4|1<<8|4<<12))
	f.Add(bytes.Repeat([]byte{1, 0x80, 0xff, 3}, 300), uint64(6|2<<4|3<<8|6<<12|3<<16|1<<20))
	f.Add(bytes.Repeat([]byte{0x3c, 0x00, 0xfc, 0x01}, 500), uint64(8|3<<4|7<<8|5<<12|2<<16|2<<20))
	f.Fuzz(func(t *testing.T, data []byte, sel uint64) {
		dt := tensor.DType(sel%11 + 1)
		op := allOps[(sel>>4)%4]
		k := int(1 + (sel>>8)%8)
		al := aliasings[(sel>>12)%uint64(len(aliasings))]
		sc := scalings[(sel>>16)%uint64(len(scalings))]
		opts := []*Options{nil, {Workers: 3, ParallelMin: 1, ChunkBytes: 1}, {Workers: 2, ParallelMin: 512, ChunkBytes: 700}}[(sel>>20)%3]
		sz := dt.Size()
		n := len(data) / (k * sz)
		bufs := make([][]byte, k)
		for i := range bufs {
			bufs[i] = bytes.Clone(data[i*n*sz : (i+1)*n*sz])
		}
		srcs, dsts := al.build(bufs, func() []byte { return make([]byte, n*sz) })
		refSrcs := make([][]byte, len(srcs))
		for i, s := range srcs {
			refSrcs[i] = bytes.Clone(s)
		}
		want := refReduce(refSrcs, dt, op, sc.pre, sc.post)
		if err := Reduce(dsts, srcs, dt, op, sc.pre, sc.post, opts); err != nil {
			t.Fatal(err)
		}
		for i, d := range dsts {
			if at := sameBits(d, want, dt); at >= 0 {
				t.Fatalf("%v %v k=%d n=%d %s %+v: dsts[%d] differs at element %d", dt, op, k, n, al.name, sc, i, at)
			}
		}
	})
}
