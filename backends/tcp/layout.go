package tcp

// Offset arithmetic shared by the algorithms. Every rank evaluates these
// functions on the same arguments (the buffer length, the world size, the
// stream count, the counts of a v-collective) and so cuts its buffer at the
// same places as its peers: the wire carries bare bytes, and both ends of a
// connection know how many to expect from the layout alone.
//
// Three levels of cutting, outermost first:
//
//   - channels: a large buffer is dealt into Config.Streams contiguous parts,
//     each moved by its own ring over its own connection, so that several
//     cores copy and reduce at once (NCCL calls these channels);
//   - blocks: a ring over n ranks cuts its channel into n blocks, the unit of
//     ownership in reduce-scatter and allgather;
//   - segments: each block is sent in segments of Config.ChunkBytes, the
//     pipeline unit, so that a block's first segment is on the wire (and
//     being reduced downstream) while its later ones are still being
//     received and reduced here.
//
// Channel and block cuts are in elements, so no element straddles two
// blocks and every piece can be handed to reduce.Reduce on its own.

// part returns the bounds [lo, hi) of part i when n units are dealt into k
// contiguous parts as evenly as possible: the first n%k parts get one unit
// more than the others. Parts may be empty when n < k.
//
// For n = 10, k = 4 the parts are [0,3) [3,6) [6,8) [8,10).
func part(n, k, i int) (lo, hi int) {
	q, r := n/k, n%k
	lo = i*q + min(i, r)
	hi = lo + q
	if i < r {
		hi++
	}
	return lo, hi
}

// segment returns segment j of buf when buf is cut into pieces of seg bytes:
// buf[j*seg : (j+1)*seg], clipped to buf, and empty past its end. A ring
// pass iterates over the segments of its largest block; smaller blocks
// simply run out early, which both ends of a connection agree on.
func segment(buf []byte, seg, j int) []byte {
	lo := min(j*seg, len(buf))
	hi := min(lo+seg, len(buf))
	return buf[lo:hi]
}

// ceilDiv returns ⌈a/b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int) int { return (a + b - 1) / b }

// mod returns a mod n in [0, n), for ring arithmetic on ranks and blocks
// where a may be negative.
func mod(a, n int) int { return ((a % n) + n) % n }

// offsets returns the running sums of counts: offsets[i] is where piece i
// starts, offsets[len(counts)] the total.
func offsets(counts []int) []int {
	off := make([]int, len(counts)+1)
	for i, c := range counts {
		off[i+1] = off[i] + c
	}
	return off
}

// segBytes is the pipeline segment for elements of esz bytes: ChunkBytes
// rounded down to whole elements, at least one element.
func segBytes(chunk, esz int) int { return max(chunk/esz, 1) * esz }
