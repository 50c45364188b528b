package tcp

import (
	"testing"
	"testing/quick"
)

// naiveParts deals n units into k parts one at a time, round-robin over
// the part sizes: the reference for part.
func naiveParts(n, k int) []int {
	size := make([]int, k)
	for i := range n {
		size[i%k]++
	}
	return size
}

func TestPartMatchesNaive(t *testing.T) {
	f := func(n uint16, k uint8) bool {
		kk := int(k%40) + 1
		want := naiveParts(int(n), kk)
		at := 0
		for i := range kk {
			lo, hi := part(int(n), kk, i)
			if lo != at || hi-lo != want[i] {
				return false
			}
			at = hi
		}
		return at == int(n)
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
}

func TestSegment(t *testing.T) {
	buf := make([]byte, 10)
	var total int
	for j := range ceilDiv(len(buf), 3) + 2 {
		s := segment(buf, 3, j)
		if j < 3 && len(s) != 3 || j == 3 && len(s) != 1 || j > 3 && len(s) != 0 {
			t.Errorf("segment %d has %d bytes", j, len(s))
		}
		total += len(s)
	}
	if total != len(buf) {
		t.Errorf("segments cover %d bytes of %d", total, len(buf))
	}
	if mod(-7, 3) != 2 || mod(7, 3) != 1 {
		t.Error("mod")
	}
}
