package hvdd_test

import (
	"context"
	"fmt"
	"log"

	hvdd "github.com/hvdd/hvdd/clients/go"
)

// The examples run as one rank against a one-slot daemon that TestMain starts
// (HVDD_SOCKET points at it). Under `hvdd run -np N` the same code runs on N
// ranks.

func Example() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx) // finds the daemon through HVDD_SOCKET
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	grad := []float32{1, 2, 3}
	// Average the gradient across ranks, in place (Horovod's allreduce_).
	if err := hvdd.Allreduce(ctx, c, grad, hvdd.WithName("grad")); err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Rank(), c.Size(), grad)
	// Output: 0 1 [1 2 3]
}

func ExampleAllreduce() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	x := []int64{10, 20}
	err = hvdd.Allreduce(ctx, c, x, hvdd.WithOp(hvdd.Sum), hvdd.WithPostscale(0.5))
	fmt.Println(x, err)
	// Output: [5 10] <nil>
}

func ExampleAlloc() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// A slice in shared memory reaches the daemon without a copy.
	buf, err := hvdd.Alloc[float32](c, 1<<20)
	if err != nil {
		log.Fatal(err)
	}
	defer hvdd.Free(c, buf)
	for i := range buf {
		buf[i] = 1
	}
	err = hvdd.Allreduce(ctx, c, buf, hvdd.WithOp(hvdd.Sum), hvdd.WithName("big"))
	fmt.Println(buf[0], buf[len(buf)-1], err)
	// Output: 1 1 <nil>
}

func ExampleAllreduceAsync() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// Start several allreduces, overlap other work, then wait for them:
	// the daemon fuses tensors that are ready together.
	grads := [][]float32{{1, 1}, {2, 2}, {3, 3}}
	var hs []*hvdd.Handle
	for i, g := range grads {
		h, err := hvdd.AllreduceAsync(c, g, hvdd.WithName(fmt.Sprint("layer", i)))
		if err != nil {
			log.Fatal(err)
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		if err := h.Wait(ctx); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(grads)
	// Output: [[1 1] [2 2] [3 3]]
}

func ExampleAllgather() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// Each rank contributes a 2x2 matrix; the result stacks them by rank.
	out, err := hvdd.Allgather(ctx, c, []int32{1, 2, 3, 4}, hvdd.WithShape(2, 2))
	fmt.Println(out, err)
	// Output: [1 2 3 4] <nil>
}

func ExampleBroadcast() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	weights := []float64{0.5, 0.25}
	err = hvdd.Broadcast(ctx, c, weights, 0, hvdd.WithName("weights"))
	fmt.Println(weights, err)
	// Output: [0.5 0.25] <nil>
}

func ExampleAlltoall() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// Send 3 rows to rank 0 (the only rank here).
	out, recv, err := hvdd.Alltoall(ctx, c, []float32{1, 2, 3}, []int32{3})
	fmt.Println(out, recv, err)
	// Output: [1 2 3] [3] <nil>
}

func ExampleReducescatter() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	out, err := hvdd.Reducescatter(ctx, c, []float32{1, 2, 3, 4}, hvdd.WithOp(hvdd.Sum))
	fmt.Println(out, err)
	// Output: [1 2 3 4] <nil>
}

func ExampleClient_Join() {
	ctx := context.Background()
	c, err := hvdd.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// A rank that runs out of data joins; it returns when every rank has,
	// with the last rank to join.
	last, err := c.Join(ctx)
	fmt.Println(last, err)
	// Output: 0 <nil>
}
