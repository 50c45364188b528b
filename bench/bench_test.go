package bench

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/tensor"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"4", 4, false},
		{"0", 0, false},
		{"64K", 64 << 10, false},
		{"64k", 64 << 10, false},
		{"64KB", 64 << 10, false},
		{"64KiB", 64 << 10, false},
		{"1M", 1 << 20, false},
		{"64MiB", 64 << 20, false},
		{"2G", 2 << 30, false},
		{" 8 ", 8, false},
		{"100B", 100, false},
		{"", 0, true},
		{"K", 0, true},
		{"1.5M", 0, true},
		{"-4", 0, true},
		{"4T", 0, true},
		{"4iB", 0, true},
		{"9999999999G", 0, true},
	} {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{4: "4", 1024: "1K", 1536: "1536", 64 << 20: "64M", 1 << 30: "1G", 0: "0"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestSummarize(t *testing.T) {
	us := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Microsecond
		}
		return out
	}
	for _, tc := range []struct {
		in            []time.Duration
		med, min, max time.Duration
	}{
		{nil, 0, 0, 0},
		{us(5), 5 * time.Microsecond, 5 * time.Microsecond, 5 * time.Microsecond},
		{us(3, 1, 2), 2 * time.Microsecond, time.Microsecond, 3 * time.Microsecond},
		{us(4, 1, 3, 2), 2500 * time.Nanosecond, time.Microsecond, 4 * time.Microsecond},
		{us(10, 10, 1000, 10, 9), 10 * time.Microsecond, 9 * time.Microsecond, 1000 * time.Microsecond},
	} {
		orig := slices.Clone(tc.in)
		s := Summarize(tc.in)
		if s.Median != tc.med || s.Min != tc.min || s.Max != tc.max || s.N != len(tc.in) {
			t.Errorf("Summarize(%v) = %+v; want median %v min %v max %v", tc.in, s, tc.med, tc.min, tc.max)
		}
		if !slices.Equal(orig, tc.in) {
			t.Errorf("Summarize modified its input")
		}
	}
}

func TestBusFactor(t *testing.T) {
	for _, tc := range []struct {
		op   tensor.OpType
		n    int
		want float64
	}{
		{tensor.Allreduce, 1, 0},
		{tensor.Allreduce, 2, 1},
		{tensor.Allreduce, 4, 1.5},
		{tensor.Allreduce, 8, 1.75},
		{tensor.Allgather, 2, 0.5},
		{tensor.Allgather, 4, 0.75},
		{tensor.Reducescatter, 4, 0.75},
		{tensor.Alltoall, 4, 0.75},
		{tensor.Broadcast, 4, 1},
		{tensor.Broadcast, 1, 1},
		{tensor.Allreduce, 0, 0},
	} {
		if got := BusFactor(tc.op, tc.n); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("BusFactor(%v, %d) = %v, want %v", tc.op, tc.n, got, tc.want)
		}
	}
}

func TestAlgBW(t *testing.T) {
	for _, tc := range []struct {
		bytes int64
		t     time.Duration
		want  float64
	}{
		{1e9, time.Second, 1},
		{64 << 20, 8 * time.Millisecond, 8.388608},
		{4, 100 * time.Microsecond, 4e-5},
		{4, 0, 0},
	} {
		if got := AlgBW(tc.bytes, tc.t); math.Abs(got-tc.want) > 1e-9*math.Max(1, tc.want) {
			t.Errorf("AlgBW(%d, %v) = %v, want %v", tc.bytes, tc.t, got, tc.want)
		}
	}
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		min, max int64
		f        float64
		es       int
		div      int64
		want     []int64
	}{
		{4, 64, 2, 4, 1, []int64{4, 8, 16, 32, 64}},
		{4, 64, 4, 4, 1, []int64{4, 16, 64}},
		{4, 100, 4, 4, 1, []int64{4, 16, 64}},
		{1, 8, 2, 4, 1, []int64{4, 8}},                   // rounded up to one element, deduplicated
		{4, 32, 2, 4, 2, []int64{8, 16, 32}},             // two ranks split the buffer
		{6, 6, 2, 2, 3, []int64{6}},                      // 3 float16 for 3 ranks
		{64 << 20, 64 << 20, 2, 4, 1, []int64{64 << 20}}, // one size
		{1000, 3000, 1.5, 1, 1, []int64{1000, 1500, 2250}},
		{4, 4, 2, 8, 1, []int64{8}},
	} {
		if got := Sizes(tc.min, tc.max, tc.f, tc.es, tc.div); !slices.Equal(got, tc.want) {
			t.Errorf("Sizes(%d, %d, %v, %d, %d) = %v, want %v", tc.min, tc.max, tc.f, tc.es, tc.div, got, tc.want)
		}
	}
}

func TestIterationsFor(t *testing.T) {
	for _, tc := range []struct {
		bytes       int64
		iters, smal int
		minTime     time.Duration
		est         time.Duration
		want        int
	}{
		{64 << 20, 20, 1000, 200 * time.Millisecond, time.Microsecond, 20},
		{4, 20, 1000, 200 * time.Millisecond, time.Millisecond, 1000},
		{4, 20, 1000, 200 * time.Millisecond, 100 * time.Microsecond, 2000},
		{4, 5000, 1000, 200 * time.Millisecond, 100 * time.Microsecond, 5000},
		{SmallBytes, 20, 1000, 0, 0, 1000},
		{SmallBytes + 1, 20, 1000, time.Second, time.Nanosecond, 20},
		{4, 20, 0, 0, time.Nanosecond, 20},
		{4, 20, 1000, time.Hour, time.Nanosecond, 1_000_000},
	} {
		if got := IterationsFor(tc.bytes, tc.iters, tc.smal, tc.minTime, tc.est); got != tc.want {
			t.Errorf("IterationsFor(%d, %d, %d, %v, %v) = %d, want %d", tc.bytes, tc.iters, tc.smal, tc.minTime, tc.est, got, tc.want)
		}
	}
}

func TestParseArgs(t *testing.T) {
	cfg, err := ParseArgs(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := DefaultConfig(); cfg != want {
		t.Errorf("defaults: got %+v, want %+v", cfg, want)
	}
	cfg, err = ParseArgs(strings.Fields("--op reducescatter --dtype fp16 --op-reduce average --min-bytes 1K --max-bytes 1M --step-factor 4 --iters 7 --warmup 0 --check --json --zero-copy=false --np 3 --socket /tmp/x.sock"), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Op != tensor.Reducescatter || cfg.DType != tensor.Float16 || cfg.Reduce != tensor.Average || cfg.MinBytes != 1024 ||
		cfg.MaxBytes != 1<<20 || cfg.StepFactor != 4 || cfg.Iters != 7 || cfg.Warmup != 0 || !cfg.Check || !cfg.JSON ||
		cfg.ZeroCopy || cfg.NP != 3 || cfg.Socket != "/tmp/x.sock" {
		t.Errorf("parsed %+v", cfg)
	}
	if cfg, err := ParseArgs([]string{"--gap", "50ms"}, &bytes.Buffer{}); err != nil || cfg.Gap != 50*time.Millisecond {
		t.Errorf("--gap 50ms: %+v, %v", cfg, err)
	}
	if cfg, err := ParseArgs(strings.Fields("--timeline tl.json --timeline-mark-cycles"), &bytes.Buffer{}); err != nil || cfg.Timeline != "tl.json" || !cfg.TimelineMarkCycles {
		t.Errorf("--timeline tl.json --timeline-mark-cycles: %+v, %v", cfg, err)
	}
	if cfg, err := ParseArgs([]string{"--profile", "resnet"}, &bytes.Buffer{}); err != nil || cfg.Profile != "resnet50" {
		t.Errorf("--profile resnet: %+v, %v", cfg, err)
	}
	var help bytes.Buffer
	if _, err := ParseArgs([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "--profile resnet50") {
		t.Errorf("--help: %v; %s", err, help.String())
	}
	for _, bad := range []string{
		"--op barrier", "--op nope", "--dtype float128", "--op-reduce adasum --check", "--op reducescatter --op-reduce max",
		"--min-bytes 0", "--min-bytes 8 --max-bytes 4", "--step-factor 1", "--iters 0", "--warmup -1",
		"--profile vgg", "--duration 0s", "--np -1", "stray", "--max-bytes 1X", "--gap -1ms",
	} {
		if _, err := ParseArgs(strings.Fields(bad), &bytes.Buffer{}); err == nil {
			t.Errorf("ParseArgs(%q) succeeded", bad)
		}
	}
}

// TestParseArgsErrors pins each refusal's text, and which one wins when a
// command line has two faults (the op and its reduction, then the sizes,
// then the numbers, then the profile).
func TestParseArgsErrors(t *testing.T) {
	tests := []struct{ args, err string }{
		{"--op barrier", "--op barrier: want allreduce, allgather, broadcast, alltoall or reducescatter"},
		{"--op nope", "unknown collective \"nope\" (want allreduce, allgather, broadcast, alltoall, reducescatter, barrier or join)"},
		{"--dtype float128", "unknown dtype \"float128\" (want one of uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool)"},
		{"--op-reduce adasum --check", "--op-reduce adasum: --check verifies element by element, and an Adasum result depends on whole vectors; time it without --check (the client tests check Adasum against its formula)"},
		{"--op-reduce adasum --dtype int32", "--op-reduce adasum: Adasum reduces float16, float32 and float64, not int32"},
		{"--op reducescatter --op-reduce adasum", "--op-reduce adasum: Adasum reduces only allreduce, not reducescatter"},
		{"--op reducescatter --op-reduce max", "reducescatter supports only sum and average, not Max"},
		{"--op-reduce nope", "unknown reduce op \"nope\" (want Average, Sum, Adasum, Min, Max or Product)"},
		{"--min-bytes 0", "--min-bytes must be at least 1"},
		{"--min-bytes 8 --max-bytes 4", "--max-bytes 4 is below --min-bytes 8"},
		{"--step-factor 1", "--step-factor 1 must be above 1"},
		{"--iters 0", "--iters must be at least 1"},
		{"--warmup -1", "--warmup must not be negative"},
		{"--small-iters -1", "--small-iters and --small-time must not be negative"},
		{"--profile vgg", "--profile \"vgg\": want resnet50 or idle"},
		{"--duration 0s", "--duration must be positive"},
		{"--timeout 0s", "--timeout must be positive"},
		{"--np -1", "--np must not be negative"},
		{"stray", "unexpected argument \"stray\" (see hvdd bench --help)"},
		{"--max-bytes 1X", "--max-bytes: bad size \"1X\": want a whole number of bytes, optionally with K, M or G (binary)"},
		{"--min-bytes 1X", "--min-bytes: bad size \"1X\": want a whole number of bytes, optionally with K, M or G (binary)"},
		{"--gap -1ms", "--gap must not be negative"},
		{"--timeline-mark-cycles", "--timeline-mark-cycles needs --timeline"},
		{"--timeline-compare --profile resnet50", "--timeline-compare needs --timeline"},
		{"--timeline x --timeline-compare", "--timeline-compare times the resnet50 profile: add --profile resnet50"},
		{"--op-reduce adasum --dtype int8 --min-bytes 0", "--op-reduce adasum: Adasum reduces float16, float32 and float64, not int8"},
		{"--iters 0 --profile vgg", "--iters must be at least 1"},
		{"--min-bytes 0 --iters 0", "--min-bytes must be at least 1"},
		{"--dtype x --op y", "unknown collective \"y\" (want allreduce, allgather, broadcast, alltoall, reducescatter, barrier or join)"},
	}
	for _, tt := range tests {
		_, err := ParseArgs(strings.Fields(tt.args), &bytes.Buffer{})
		if err == nil || err.Error() != tt.err {
			t.Errorf("ParseArgs(%q) = %v, want %q", tt.args, err, tt.err)
		}
	}
}

// TestCheckColumn: off without --check; FAIL when any rank saw a wrong
// result.
func TestCheckColumn(t *testing.T) {
	tests := []struct {
		check bool
		bad   float64
		want  string
	}{
		{false, 0, "off"},
		{false, 3, "off"},
		{true, 0, "ok"},
		{true, 1, "FAIL"},
	}
	for _, tt := range tests {
		if got := checkColumn(tt.check, tt.bad); got != tt.want {
			t.Errorf("checkColumn(%v, %v) = %q, want %q", tt.check, tt.bad, got, tt.want)
		}
	}
}

func TestStripFlag(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"--np 2 --op allgather", "--op allgather"},
		{"--op allgather -np 4 --check", "--op allgather --check"},
		{"--np=2 --json", "--json"},
		{"-np=2", ""},
		{"--npx 3", "--npx 3"},
		{"--check -- --np 2", "--check -- --np 2"},
	} {
		if got := strings.Join(StripFlag(strings.Fields(tc.in), "np"), " "); got != tc.want {
			t.Errorf("StripFlag(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestReference(t *testing.T) {
	vals := func(v ...int64) func(int) int64 { return func(r int) int64 { return v[r] } }
	for _, tc := range []struct {
		op   tensor.ReduceOp
		dt   tensor.DType
		v    []int64
		want float64
	}{
		{tensor.Sum, tensor.Float32, []int64{3, -4, 2}, 1},
		{tensor.Average, tensor.Float32, []int64{3, -4, 2}, 1.0 / 3},
		{tensor.Min, tensor.Float64, []int64{3, -4, 2}, -4},
		{tensor.Max, tensor.Float16, []int64{3, -4, 2}, 3},
		{tensor.Product, tensor.BFloat16, []int64{3, 2, 2}, 12},
		{tensor.Sum, tensor.Int8, []int64{100, 100}, -56},        // wraps
		{tensor.Sum, tensor.Uint8, []int64{200, 100}, 44},        // wraps
		{tensor.Average, tensor.Int32, []int64{3, 4}, 3},         // truncates
		{tensor.Average, tensor.Int32, []int64{-3, -4}, -3},      // toward zero
		{tensor.Average, tensor.Int8, []int64{100, 100}, -28},    // sum wraps first
		{tensor.Product, tensor.Int16, []int64{300, 300}, 24464}, // 90000 wrapped
		{tensor.Min, tensor.Uint16, []int64{7, 3}, 3},
		{tensor.Sum, tensor.Bool, []int64{0, 1}, 1},
		{tensor.Max, tensor.Bool, []int64{0, 0}, 0},
		{tensor.Min, tensor.Bool, []int64{1, 0}, 0},
		{tensor.Product, tensor.Bool, []int64{1, 1}, 1},
		{tensor.Average, tensor.Bool, []int64{1, 0}, 1},
	} {
		if got := Reference(tc.op, tc.dt, len(tc.v), vals(tc.v...)); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Reference(%v, %v, %v) = %v, want %v", tc.op, tc.dt, tc.v, got, tc.want)
		}
	}
}

func TestInputValueRanges(t *testing.T) {
	for _, dt := range tensor.DTypes() {
		for _, op := range []tensor.ReduceOp{tensor.Sum, tensor.Product} {
			for i := int64(0); i < 100; i++ {
				v := InputValue(op, dt, int(i%5), i)
				lo, hi := int64(-4), int64(4)
				switch {
				case dt == tensor.Bool:
					lo, hi = 0, 1
				case op == tensor.Product:
					lo, hi = 1, 3
				case isUnsigned(dt):
					lo, hi = 0, 8
				}
				if v < lo || v > hi {
					t.Fatalf("InputValue(%v, %v, %d, %d) = %d, outside [%d, %d]", op, dt, i%5, i, v, lo, hi)
				}
			}
		}
	}
}

// TestVerify checks that Verify accepts a correct result of every op and
// catches a corrupted one.
func TestVerify(t *testing.T) {
	for _, op := range []tensor.OpType{tensor.Allreduce, tensor.Allgather, tensor.Broadcast, tensor.Alltoall, tensor.Reducescatter} {
		for _, n := range []int{1, 2, 3} {
			e := Expect{Op: op, Reduce: tensor.Sum, DType: tensor.Float32, Ranks: n, Rank: n - 1, Count: int64(12 * n)}
			out := make([]float32, e.OutputLen())
			for j := range out {
				out[j] = float32(e.Want(int64(j)))
			}
			if bad, first := Verify(e, out); bad != 0 {
				t.Errorf("%v n=%d: correct result rejected: %s", op, n, first)
			}
			out[len(out)/2] += 0.5
			if bad, _ := Verify(e, out); bad != 1 {
				t.Errorf("%v n=%d: corruption found %d wrong, want 1", op, n, bad)
			}
			if bad, _ := Verify(e, out[1:]); bad == 0 {
				t.Errorf("%v n=%d: short result accepted", op, n)
			}
		}
	}
	// Allreduce on 2 ranks: the result is the element-wise sum of both inputs.
	e := Expect{Op: tensor.Allreduce, Reduce: tensor.Sum, DType: tensor.Int8, Ranks: 2, Count: 5}
	in0, in1 := make([]int8, 5), make([]int8, 5)
	Fill(e, in0)
	e.Rank = 1
	Fill(e, in1)
	sum := make([]int8, 5)
	for i := range sum {
		sum[i] = in0[i] + in1[i]
	}
	if bad, first := Verify(e, sum); bad != 0 {
		t.Errorf("int8 sum rejected: %s", first)
	}
	// Half types round: within tolerance passes, beyond fails.
	if !Close(1.0009765625, 1, Tolerance(tensor.Float16, 2)) || Close(1.01, 1, Tolerance(tensor.Float16, 2)) {
		t.Errorf("float16 tolerance wrong")
	}
	if Tolerance(tensor.Int32, 4) != 0 || !Close(3, 3, 0) || Close(3, 4, 0) {
		t.Errorf("integers must compare exactly")
	}
}

func TestEncodeDecode(t *testing.T) {
	for _, v := range []int64{-4, 0, 1, 3, 8, 99} {
		if got := decode(encode[float32](v)); got != float64(v) {
			t.Errorf("float32 %d -> %v", v, got)
		}
		if got := decode(encode[hvdd.Float16](v)); got != float64(v) {
			t.Errorf("float16 %d -> %v", v, got)
		}
		if got := decode(encode[hvdd.BFloat16](v)); got != float64(v) {
			t.Errorf("bfloat16 %d -> %v", v, got)
		}
		if got := decode(encode[int16](v)); got != float64(v) {
			t.Errorf("int16 %d -> %v", v, got)
		}
	}
	if decode(encode[bool](2)) != 1 || decode(encode[bool](0)) != 0 {
		t.Errorf("bool encode/decode wrong")
	}
	if decode(encode[uint8](-1)) != 255 {
		t.Errorf("uint8 should wrap")
	}
}

func TestParseStatTicks(t *testing.T) {
	stat := "1234 (hvdd serve) S 1 1234 1234 0 -1 4194560 500 0 0 0 17 4 0 0 20 0 9 0 100 1000000 300 18446744073709551615"
	if got, err := ParseStatTicks(stat); err != nil || got != 21 {
		t.Errorf("ParseStatTicks = %d, %v; want 21", got, err)
	}
	weird := "77 (a) b) (c) R 1 1 1 0 -1 0 0 0 0 0 5 6 0 0"
	if got, err := ParseStatTicks(weird); err != nil || got != 11 {
		t.Errorf("ParseStatTicks(name with parens) = %d, %v; want 11", got, err)
	}
	for _, bad := range []string{"", "12 (x) S 1 2", "12 (x) S 1 2 3 4 5 6 7 8 9 10 a b"} {
		if _, err := ParseStatTicks(bad); err == nil {
			t.Errorf("ParseStatTicks(%q) succeeded", bad)
		}
	}
	if _, err := CPUTicks(1 << 30); err == nil {
		t.Errorf("CPUTicks of a missing pid succeeded")
	}
}

func TestResNet50Sizes(t *testing.T) {
	var sum int
	for _, s := range ResNet50Sizes {
		sum += s
	}
	if len(ResNet50Sizes) != 161 || sum != ResNet50Elements || ResNet50Elements != 25557032 {
		t.Errorf("%d tensors, %d elements; want 161 and 25,557,032", len(ResNet50Sizes), sum)
	}
}
