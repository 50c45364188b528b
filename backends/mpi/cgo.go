//go:build mpi

package mpi

// This file is the package's cgo seam (flags_*.go only pick the compiler
// flags): the C helpers below and thin Go
// wrappers that return raw MPI codes. Everything above it (thread levels,
// polling, chunking, errors) is Go in backend.go.
//
// The helpers take a request pointer: NULL means the blocking call
// (MPI_Allreduce), non-NULL the nonblocking one (MPI_Iallreduce) whose
// handle is stored there. Element types and reduce ops are passed as
// tensor.DType and tensor.ReduceOp numbers and mapped to MPI handles in C,
// because MPI handles are macros of different shapes in Open MPI (pointers)
// and MPICH (integers).

/*
#define _GNU_SOURCE // ppoll
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// tensor.DType numbers.
enum { HV_UINT8 = 1, HV_INT8, HV_UINT16, HV_INT16, HV_INT32, HV_INT64,
       HV_FLOAT16, HV_BFLOAT16, HV_FLOAT32, HV_FLOAT64, HV_BOOL };
// tensor.ReduceOp numbers.
enum { HV_SUM = 1, HV_MIN = 3, HV_MAX = 4, HV_PROD = 5 };

// Zero-length buffers are passed as a pointer to this, never NULL, so no MPI
// implementation mistakes them for an invalid buffer.
static char hv_dummy[64];
#define HV_P(p) ((p) ? (p) : (void *)hv_dummy)

// ---- float16 / bfloat16 (the same conversions as package reduce) ----

static inline float hv_bits_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t hv_f32_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

static inline float hv_f16_to_f32(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (exp == 0x1f) return hv_bits_f32(sign | (man ? 0x7fc00000u | man << 13 : 0x7f800000u));
	if (exp == 0) return hv_bits_f32(sign | hv_f32_bits((float)man * (1.0f / 16777216.0f)));
	return hv_bits_f32(sign | (exp + 127 - 15) << 23 | man << 13);
}

static inline uint16_t hv_f32_to_f16(float f) {
	uint32_t b = hv_f32_bits(f);
	uint16_t sign = (uint16_t)(b >> 16) & 0x8000;
	int exp = (int)(b >> 23) & 0xff;
	uint32_t man = b & 0x7fffff;
	if (exp == 0xff) return man ? (uint16_t)(sign | 0x7e00 | (man >> 13)) : (uint16_t)(sign | 0x7c00);
	int e = exp - 127 + 15;
	if (e >= 0x1f) return sign | 0x7c00;
	if (e <= 0) {
		if (exp == 0) return sign;
		unsigned s = (unsigned)(126 - exp);
		if (s > 31) return sign;
		uint32_t m = man | 0x800000, q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
		if (rem > half || (rem == half && (q & 1))) q++;
		return (uint16_t)(sign | q);
	}
	uint16_t h = (uint16_t)(sign | (uint16_t)e << 10 | (uint16_t)(man >> 13));
	uint32_t rem = man & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
	return h;
}

static inline float hv_bf16_to_f32(uint16_t h) { return hv_bits_f32((uint32_t)h << 16); }

static inline uint16_t hv_f32_to_bf16(float f) {
	uint32_t b = hv_f32_bits(f);
	if ((b & 0x7fffffff) > 0x7f800000) return (uint16_t)(b >> 16) | 0x40;
	b += 0x7fff + ((b >> 16) & 1);
	return (uint16_t)(b >> 16);
}

// User-defined reductions on the 2-byte half types: widen both operands,
// combine in float32, round back to nearest-even. MPI computes
// inout = in (op) inout with in the earlier operand; Min and Max keep the
// earlier one unless the later compares strictly less (greater), as the
// reduce package does.
#define HV_HALF_OP(NAME, TO, FROM, EXPR) \
static void NAME(void *invec, void *inoutvec, int *len, MPI_Datatype *dt) { \
	(void)dt; \
	const unsigned char *in = invec; unsigned char *io = inoutvec; \
	for (int i = 0; i < *len; i++) { \
		uint16_t x, y; memcpy(&x, in + 2 * i, 2); memcpy(&y, io + 2 * i, 2); \
		float a = TO(x), b = TO(y); \
		uint16_t r = FROM(EXPR); memcpy(io + 2 * i, &r, 2); \
	} \
}
HV_HALF_OP(hv_f16_sum, hv_f16_to_f32, hv_f32_to_f16, a + b)
HV_HALF_OP(hv_f16_prod, hv_f16_to_f32, hv_f32_to_f16, a * b)
HV_HALF_OP(hv_f16_min, hv_f16_to_f32, hv_f32_to_f16, b < a ? b : a)
HV_HALF_OP(hv_f16_max, hv_f16_to_f32, hv_f32_to_f16, b > a ? b : a)
HV_HALF_OP(hv_bf16_sum, hv_bf16_to_f32, hv_f32_to_bf16, a + b)
HV_HALF_OP(hv_bf16_prod, hv_bf16_to_f32, hv_f32_to_bf16, a * b)
HV_HALF_OP(hv_bf16_min, hv_bf16_to_f32, hv_f32_to_bf16, b < a ? b : a)
HV_HALF_OP(hv_bf16_max, hv_bf16_to_f32, hv_f32_to_bf16, b > a ? b : a)

// Wrap-around Sum for 8- and 16-bit integers (signedness does not matter).
// MPI_SUM is not used for them: Open MPI 4.1's op/avx component saturates
// 8- and 16-bit integer sums instead of wrapping.
static void hv_sum_u8(void *invec, void *inoutvec, int *len, MPI_Datatype *dt) {
	(void)dt;
	const uint8_t *in = invec; uint8_t *io = inoutvec;
	for (int i = 0; i < *len; i++) io[i] = (uint8_t)(in[i] + io[i]);
}
static void hv_sum_u16(void *invec, void *inoutvec, int *len, MPI_Datatype *dt) {
	(void)dt;
	const unsigned char *in = invec; unsigned char *io = inoutvec;
	for (int i = 0; i < *len; i++) {
		uint16_t x, y; memcpy(&x, in + 2 * i, 2); memcpy(&y, io + 2 * i, 2);
		y = (uint16_t)(x + y); memcpy(io + 2 * i, &y, 2);
	}
}

// Min and Max of unsigned 8- and 16-bit integers. MPICH 4.0.2 (Debian 12)
// compares MPI_UINT8_T, MPI_UINT16_T (and wider unsigned types, which hvdd
// does not have) as signed in MPI_MIN and MPI_MAX: min(0x86, 0x4f) = 0x86.
#define HV_UMINMAX(name, T, cmp) \
static void name(void *invec, void *inoutvec, int *len, MPI_Datatype *dt) { \
	(void)dt; \
	const unsigned char *in = invec; unsigned char *io = inoutvec; \
	for (int i = 0; i < *len; i++) { \
		T x, y; memcpy(&x, in + sizeof(T) * i, sizeof(T)); memcpy(&y, io + sizeof(T) * i, sizeof(T)); \
		if (x cmp y) memcpy(io + sizeof(T) * i, &x, sizeof(T)); \
	} \
}
HV_UMINMAX(hv_min_u8, uint8_t, <)
HV_UMINMAX(hv_max_u8, uint8_t, >)
HV_UMINMAX(hv_min_u16, uint16_t, <)
HV_UMINMAX(hv_max_u16, uint16_t, >)

static MPI_Datatype hv_f16_type, hv_bf16_type;
static MPI_Op hv_half_ops[2][6]; // [bf16][tensor.ReduceOp]
static MPI_Op hv_sum8_op, hv_sum16_op;
static MPI_Op hv_umin8_op, hv_umax8_op, hv_umin16_op, hv_umax16_op;
static int hv_ready;

// hv_setup creates the half types and ops once per process.
static int hv_setup(void) {
	if (hv_ready) return MPI_SUCCESS;
	int rc;
	if ((rc = MPI_Type_contiguous(2, MPI_BYTE, &hv_f16_type)) || (rc = MPI_Type_commit(&hv_f16_type))) return rc;
	if ((rc = MPI_Type_contiguous(2, MPI_BYTE, &hv_bf16_type)) || (rc = MPI_Type_commit(&hv_bf16_type))) return rc;
	MPI_User_function *fns[2][6] = {
		{0, hv_f16_sum, 0, hv_f16_min, hv_f16_max, hv_f16_prod},
		{0, hv_bf16_sum, 0, hv_bf16_min, hv_bf16_max, hv_bf16_prod},
	};
	for (int t = 0; t < 2; t++)
		for (int o = 0; o < 6; o++) {
			hv_half_ops[t][o] = MPI_OP_NULL;
			if (fns[t][o] && (rc = MPI_Op_create(fns[t][o], 1, &hv_half_ops[t][o]))) return rc;
		}
	if ((rc = MPI_Op_create(hv_sum_u8, 1, &hv_sum8_op)) || (rc = MPI_Op_create(hv_sum_u16, 1, &hv_sum16_op))) return rc;
	if ((rc = MPI_Op_create(hv_min_u8, 1, &hv_umin8_op)) || (rc = MPI_Op_create(hv_max_u8, 1, &hv_umax8_op)) ||
	    (rc = MPI_Op_create(hv_min_u16, 1, &hv_umin16_op)) || (rc = MPI_Op_create(hv_max_u16, 1, &hv_umax16_op))) return rc;
	hv_ready = 1;
	return MPI_SUCCESS;
}

static MPI_Datatype hv_type(int dt) {
	switch (dt) {
	case HV_UINT8: return MPI_UINT8_T;
	case HV_INT8: return MPI_INT8_T;
	case HV_UINT16: return MPI_UINT16_T;
	case HV_INT16: return MPI_INT16_T;
	case HV_INT32: return MPI_INT32_T;
	case HV_INT64: return MPI_INT64_T;
	case HV_FLOAT16: return hv_f16_type;
	case HV_BFLOAT16: return hv_bf16_type;
	case HV_FLOAT32: return MPI_FLOAT;
	case HV_FLOAT64: return MPI_DOUBLE;
	case HV_BOOL: return MPI_C_BOOL;
	}
	return MPI_DATATYPE_NULL;
}

static MPI_Op hv_op(int dt, int op) {
	if (dt == HV_BOOL) return (op == HV_SUM || op == HV_MAX) ? MPI_LOR : MPI_LAND;
	if (dt == HV_FLOAT16 || dt == HV_BFLOAT16) return hv_half_ops[dt == HV_BFLOAT16][op];
	if (op == HV_SUM && (dt == HV_UINT8 || dt == HV_INT8)) return hv_sum8_op;
	if (op == HV_SUM && (dt == HV_UINT16 || dt == HV_INT16)) return hv_sum16_op;
	if (dt == HV_UINT8 && (op == HV_MIN || op == HV_MAX)) return op == HV_MIN ? hv_umin8_op : hv_umax8_op;
	if (dt == HV_UINT16 && (op == HV_MIN || op == HV_MAX)) return op == HV_MIN ? hv_umin16_op : hv_umax16_op;
	switch (op) {
	case HV_SUM: return MPI_SUM;
	case HV_MIN: return MPI_MIN;
	case HV_MAX: return MPI_MAX;
	case HV_PROD: return MPI_PROD;
	}
	return MPI_OP_NULL;
}

// ---- process ----

// Thread levels, in MPI's order.
enum { HV_SINGLE, HV_FUNNELED, HV_SERIALIZED, HV_MULTIPLE };

static int hv_level_to_mpi(int l) {
	switch (l) {
	case HV_SINGLE: return MPI_THREAD_SINGLE;
	case HV_FUNNELED: return MPI_THREAD_FUNNELED;
	case HV_SERIALIZED: return MPI_THREAD_SERIALIZED;
	}
	return MPI_THREAD_MULTIPLE;
}

static int hv_level_from_mpi(int m) {
	if (m == MPI_THREAD_MULTIPLE) return HV_MULTIPLE;
	if (m == MPI_THREAD_SERIALIZED) return HV_SERIALIZED;
	if (m == MPI_THREAD_FUNNELED) return HV_FUNNELED;
	return HV_SINGLE;
}

// hv_init initialises MPI unless it already is. *ours tells whether this call
// did; *level is the provided thread level; *main whether the calling thread
// is MPI's main thread.
static int hv_init(int want, int *level, int *ours, int *main) {
	int flag = 0, provided = MPI_THREAD_SINGLE, rc;
	*ours = 0;
	MPI_Finalized(&flag);
	if (flag) return MPI_ERR_OTHER;
	MPI_Initialized(&flag);
	if (flag) {
		if ((rc = MPI_Query_thread(&provided))) return rc;
	} else {
		if ((rc = MPI_Init_thread(NULL, NULL, hv_level_to_mpi(want), &provided))) return rc;
		*ours = 1;
	}
	*level = hv_level_from_mpi(provided);
	if (*level > want) *level = want;
	MPI_Is_thread_main(main);
	return hv_setup();
}

// hv_finalize frees what hv_setup made, then finalises MPI.
static int hv_finalize(void) {
	if (hv_ready) {
		MPI_Type_free(&hv_f16_type);
		MPI_Type_free(&hv_bf16_type);
		for (int t = 0; t < 2; t++)
			for (int o = 0; o < 6; o++)
				if (hv_half_ops[t][o] != MPI_OP_NULL) MPI_Op_free(&hv_half_ops[t][o]);
		MPI_Op *ops[] = {&hv_sum8_op, &hv_sum16_op, &hv_umin8_op, &hv_umax8_op, &hv_umin16_op, &hv_umax16_op};
		for (unsigned i = 0; i < sizeof ops / sizeof ops[0]; i++) MPI_Op_free(ops[i]);
		hv_ready = 0;
	}
	return MPI_Finalize();
}

static int hv_dup_world(MPI_Comm *out, int *rank, int *size) {
	int rc;
	if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, out))) return rc;
	if ((rc = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN))) return rc;
	if ((rc = MPI_Comm_rank(*out, rank))) return rc;
	return MPI_Comm_size(*out, size);
}

static int hv_comm_free(MPI_Comm *c) { return MPI_Comm_free(c); }

// hv_comm_group makes the communicator of n ranks of parent
// (MPI_Comm_create_group: collective over those ranks only).
static int hv_comm_group(MPI_Comm parent, int n, int *ranks, int tag, MPI_Comm *out, int *rank) {
	MPI_Group pg, g;
	int rc;
	if ((rc = MPI_Comm_group(parent, &pg))) return rc;
	rc = MPI_Group_incl(pg, n, ranks, &g);
	MPI_Group_free(&pg);
	if (rc) return rc;
	rc = MPI_Comm_create_group(parent, g, tag, out);
	MPI_Group_free(&g);
	if (rc) return rc;
	if ((rc = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN))) return rc;
	return MPI_Comm_rank(*out, rank);
}

// ---- collectives ----

static int hv_allreduce(MPI_Comm c, void *buf, int count, int dt, int op, MPI_Request *req) {
	if (req) return MPI_Iallreduce(MPI_IN_PLACE, HV_P(buf), count, hv_type(dt), hv_op(dt, op), c, req);
	return MPI_Allreduce(MPI_IN_PLACE, HV_P(buf), count, hv_type(dt), hv_op(dt, op), c);
}

static int hv_allgatherv(MPI_Comm c, void *in, int n, void *out, int *counts, int *displs, MPI_Request *req) {
	if (req) return MPI_Iallgatherv(HV_P(in), n, MPI_BYTE, HV_P(out), counts, displs, MPI_BYTE, c, req);
	return MPI_Allgatherv(HV_P(in), n, MPI_BYTE, HV_P(out), counts, displs, MPI_BYTE, c);
}

static int hv_bcast(MPI_Comm c, void *buf, int n, int root, MPI_Request *req) {
	if (req) return MPI_Ibcast(HV_P(buf), n, MPI_BYTE, root, c, req);
	return MPI_Bcast(HV_P(buf), n, MPI_BYTE, root, c);
}

static int hv_alltoallv(MPI_Comm c, void *in, int *sc, int *sd, void *out, int *rc, int *rd, MPI_Request *req) {
	if (req) return MPI_Ialltoallv(HV_P(in), sc, sd, MPI_BYTE, HV_P(out), rc, rd, MPI_BYTE, c, req);
	return MPI_Alltoallv(HV_P(in), sc, sd, MPI_BYTE, HV_P(out), rc, rd, MPI_BYTE, c);
}

static int hv_reduce_scatter(MPI_Comm c, void *in, void *out, int *counts, int dt, int op, MPI_Request *req) {
	if (req) return MPI_Ireduce_scatter(HV_P(in), HV_P(out), counts, hv_type(dt), hv_op(dt, op), c, req);
	return MPI_Reduce_scatter(HV_P(in), HV_P(out), counts, hv_type(dt), hv_op(dt, op), c);
}

static int hv_reduce(MPI_Comm c, void *in, void *out, int count, int dt, int op, int root, MPI_Request *req) {
	if (req) return MPI_Ireduce(HV_P(in), HV_P(out), count, hv_type(dt), hv_op(dt, op), root, c, req);
	return MPI_Reduce(HV_P(in), HV_P(out), count, hv_type(dt), hv_op(dt, op), root, c);
}

static int hv_barrier(MPI_Comm c, MPI_Request *req) {
	if (req) return MPI_Ibarrier(c, req);
	return MPI_Barrier(c);
}

// Tagged point-to-point messages of the Bridge.
static int hv_iprobe_any(MPI_Comm c, int *flag, int *src, int *tag, int *n) {
	MPI_Status st;
	int rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, flag, &st);
	if (rc || !*flag) return rc;
	*src = st.MPI_SOURCE; *tag = st.MPI_TAG;
	return MPI_Get_count(&st, MPI_BYTE, n);
}
// hv_next_wait is the bridge receiver's next idle wait after w: twice as
// long, at least min_ns, at most max_ns.
static int64_t hv_next_wait(int64_t w, int64_t min_ns, int64_t max_ns) {
	if (w >= max_ns / 2) return max_ns; // (and no overflow)
	return 2 * w < min_ns ? min_ns : 2 * w;
}

// hv_idle_probe is the bridge receiver's idle wait (Bridge.nap): it sleeps,
// each time hv_next_wait(*wait) ns, and probes after each sleep, until a
// message waits (*flag set, as hv_iprobe_any) or wake_fd becomes readable
// (*flag 0; the eventfd is drained). It loops here in C because every
// return from a system call into Go wakes Go's sysmon thread as well: in
// Go, the idle probing of a formed job cost about 3 % of a core per daemon.
static int hv_idle_probe(MPI_Comm c, int wake_fd, int64_t *wait, int64_t min_ns, int64_t max_ns,
                         int *flag, int *src, int *tag, int *n) {
	for (;;) {
		int64_t w = *wait = hv_next_wait(*wait, min_ns, max_ns);
		struct timespec ts = { (time_t)(w / 1000000000), (long)(w % 1000000000) };
		struct pollfd p = { .fd = wake_fd, .events = POLLIN };
		if (ppoll(&p, 1, &ts, NULL) > 0) {
			uint64_t v;
			ssize_t r = read(wake_fd, &v, sizeof v);
			(void)r;
			*flag = 0;
			return MPI_SUCCESS;
		}
		int rc = hv_iprobe_any(c, flag, src, tag, n);
		if (rc || *flag) return rc;
	}
}
static int hv_recv_from(MPI_Comm c, void *buf, int n, int src, int tag) {
	return MPI_Recv(buf, n, MPI_BYTE, src, tag, c, MPI_STATUS_IGNORE);
}
static int hv_send_tag(MPI_Comm c, void *buf, int n, int dst, int tag) {
	return MPI_Send(buf, n, MPI_BYTE, dst, tag, c);
}
static int hv_tag_ub(MPI_Comm c, int *ub) {
	int *v, flag;
	int rc = MPI_Comm_get_attr(c, MPI_TAG_UB, &v, &flag);
	*ub = (rc == MPI_SUCCESS && flag) ? *v : 32767;
	return rc;
}

static int hv_isend(MPI_Comm c, void *buf, int n, int peer, MPI_Request *req) {
	return MPI_Isend(HV_P(buf), n, MPI_BYTE, peer, 0, c, req);
}

static int hv_irecv(MPI_Comm c, void *buf, int n, int peer, MPI_Request *req) {
	return MPI_Irecv(HV_P(buf), n, MPI_BYTE, peer, 0, c, req);
}

static int hv_waitall(int n, MPI_Request *reqs) { return MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE); }

static int hv_testall(int n, MPI_Request *reqs, int *done) { return MPI_Testall(n, reqs, done, MPI_STATUSES_IGNORE); }

static MPI_Request hv_request_null(void) { return MPI_REQUEST_NULL; }

// ---- errors ----

static void hv_error_string(int code, char *buf, int cap, int *cls) {
	int n = 0;
	buf[0] = 0;
	if (MPI_Error_string(code, buf, &n) != MPI_SUCCESS) n = 0;
	if (n >= cap) n = cap - 1;
	buf[n] = 0;
	if (MPI_Error_class(code, cls) != MPI_SUCCESS) *cls = -1;
}

// hv_failed_rank returns the rank of c that a process-failure error (ULFM's
// MPIX_ERR_PROC_FAILED) names, -1 when code is another error or the
// library has no ULFM support.
static int hv_failed_rank(MPI_Comm c, int code) {
#if defined(MPIX_ERR_PROC_FAILED)
	int cls = 0, n = 0, zero = 0, r = MPI_UNDEFINED;
	MPI_Group failed, all;
	if (MPI_Error_class(code, &cls) != MPI_SUCCESS || cls != MPIX_ERR_PROC_FAILED) return -1;
	if (MPIX_Comm_failure_ack(c) != MPI_SUCCESS || MPIX_Comm_failure_get_acked(c, &failed) != MPI_SUCCESS) return -1;
	MPI_Group_size(failed, &n);
	if (n > 0 && MPI_Comm_group(c, &all) == MPI_SUCCESS) {
		MPI_Group_translate_ranks(failed, 1, &zero, all, &r);
		MPI_Group_free(&all);
	}
	MPI_Group_free(&failed);
	return r == MPI_UNDEFINED ? -1 : r;
#else
	(void)c; (void)code;
	return -1;
#endif
}

static int hv_max_error_string(void) { return MPI_MAX_ERROR_STRING; }

static int hv_library_version(char *buf, int cap) {
	int n = 0;
	if (cap < MPI_MAX_LIBRARY_VERSION_STRING) return MPI_ERR_OTHER;
	int rc = MPI_Get_library_version(buf, &n);
	buf[n < cap ? n : cap - 1] = 0;
	return rc;
}
*/
import "C"

import (
	"strings"
	"time"
	"unsafe"
)

// Thread levels, numbered as MPI orders them.
type threadLevel int

const (
	levelSingle threadLevel = iota
	levelFunneled
	levelSerialized
	levelMultiple
)

func (l threadLevel) String() string {
	switch l {
	case levelSingle:
		return "MPI_THREAD_SINGLE"
	case levelFunneled:
		return "MPI_THREAD_FUNNELED"
	case levelSerialized:
		return "MPI_THREAD_SERIALIZED"
	}
	return "MPI_THREAD_MULTIPLE"
}

// comm is an MPI communicator handle (a pointer in Open MPI, an int in MPICH).
type comm struct{ c C.MPI_Comm }

// request is an MPI request handle. A []request is laid out as the
// MPI_Request array MPI_Waitall takes.
type request struct{ r C.MPI_Request }

func nullRequest() request { return request{C.hv_request_null()} }

// reqPtr is the C pointer for an optional request: nil asks for the
// blocking call.
func reqPtr(r *request) *C.MPI_Request {
	if r == nil {
		return nil
	}
	return &r.r
}

func ints(s []int32) *C.int {
	if len(s) == 0 {
		return nil
	}
	return (*C.int)(unsafe.Pointer(&s[0]))
}

func cInit(want threadLevel) (level threadLevel, ours, main bool, rc int) {
	var l, o, m C.int
	rc = int(C.hv_init(C.int(want), &l, &o, &m))
	return threadLevel(l), o != 0, m != 0, rc
}

func cFinalize() int { return int(C.hv_finalize()) }

func cDupWorld() (c comm, rank, size int, rc int) {
	var r, s C.int
	rc = int(C.hv_dup_world(&c.c, &r, &s))
	return c, int(r), int(s), rc
}

func (c *comm) free() int { return int(C.hv_comm_free(&c.c)) }

// group makes the communicator of ranks of c (MPI_Comm_create_group) and
// returns it with this rank's place in it.
func (c comm) group(ranks []int32, tag int) (g comm, rank int, rc int) {
	var r C.int
	rc = int(C.hv_comm_group(c.c, C.int(len(ranks)), ints(ranks), C.int(tag), &g.c, &r))
	return g, int(r), rc
}

func (c comm) allreduce(buf unsafe.Pointer, count int, dt, op int, req *request) int {
	return int(C.hv_allreduce(c.c, buf, C.int(count), C.int(dt), C.int(op), reqPtr(req)))
}

func (c comm) allgatherv(in unsafe.Pointer, n int, out unsafe.Pointer, counts, displs []int32, req *request) int {
	return int(C.hv_allgatherv(c.c, in, C.int(n), out, ints(counts), ints(displs), reqPtr(req)))
}

func (c comm) bcast(buf unsafe.Pointer, n, root int, req *request) int {
	return int(C.hv_bcast(c.c, buf, C.int(n), C.int(root), reqPtr(req)))
}

func (c comm) alltoallv(in unsafe.Pointer, sc, sd []int32, out unsafe.Pointer, rc, rd []int32, req *request) int {
	return int(C.hv_alltoallv(c.c, in, ints(sc), ints(sd), out, ints(rc), ints(rd), reqPtr(req)))
}

func (c comm) reduceScatter(in, out unsafe.Pointer, counts []int32, dt, op int, req *request) int {
	return int(C.hv_reduce_scatter(c.c, in, out, ints(counts), C.int(dt), C.int(op), reqPtr(req)))
}

func (c comm) reduce(in, out unsafe.Pointer, count, dt, op, root int, req *request) int {
	return int(C.hv_reduce(c.c, in, out, C.int(count), C.int(dt), C.int(op), C.int(root), reqPtr(req)))
}

func (c comm) barrier(req *request) int { return int(C.hv_barrier(c.c, reqPtr(req))) }

// probeAny reports a waiting message without receiving it (MPI_Iprobe).
func (c comm) probeAny() (ok bool, src, tag, n, rc int) {
	var f, cs, ct, cn C.int
	rc = int(C.hv_iprobe_any(c.c, &f, &cs, &ct, &cn))
	return f != 0, int(cs), int(ct), int(cn), rc
}

// idleProbe sleeps and probes in C until a message waits or wake rings (see
// hv_idle_probe); wait is the pacer's, updated in place.
func (c comm) idleProbe(wake int, wait *time.Duration, minWait, maxWait time.Duration) (ok bool, src, tag, n, rc int) {
	var f, cs, ct, cn C.int
	w := C.int64_t(*wait)
	rc = int(C.hv_idle_probe(c.c, C.int(wake), &w, C.int64_t(minWait), C.int64_t(maxWait), &f, &cs, &ct, &cn))
	*wait = time.Duration(w)
	return f != 0, int(cs), int(ct), int(cn), rc
}

// nextWait is hv_next_wait, for tests.
func nextWait(w, minWait, maxWait time.Duration) time.Duration {
	return time.Duration(C.hv_next_wait(C.int64_t(w), C.int64_t(minWait), C.int64_t(maxWait)))
}

func (c comm) recvFrom(buf []byte, src, tag int) int {
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	return int(C.hv_recv_from(c.c, p, C.int(len(buf)), C.int(src), C.int(tag)))
}

func (c comm) sendTag(buf []byte, dst, tag int) int {
	var p unsafe.Pointer
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	return int(C.hv_send_tag(c.c, p, C.int(len(buf)), C.int(dst), C.int(tag)))
}

func (c comm) tagUB() int {
	var ub C.int
	C.hv_tag_ub(c.c, &ub)
	return int(ub)
}

func (c comm) isend(buf unsafe.Pointer, n, peer int, req *request) int {
	return int(C.hv_isend(c.c, buf, C.int(n), C.int(peer), &req.r))
}

func (c comm) irecv(buf unsafe.Pointer, n, peer int, req *request) int {
	return int(C.hv_irecv(c.c, buf, C.int(n), C.int(peer), &req.r))
}

func waitAll(reqs []request) int {
	if len(reqs) == 0 {
		return 0
	}
	return int(C.hv_waitall(C.int(len(reqs)), &reqs[0].r))
}

func testAll(reqs []request) (done bool, rc int) {
	if len(reqs) == 0 {
		return true, 0
	}
	var d C.int
	rc = int(C.hv_testall(C.int(len(reqs)), &reqs[0].r, &d))
	return d != 0, rc
}

func (c comm) failedRank(code int) int { return int(C.hv_failed_rank(c.c, C.int(code))) }

// errorString returns MPI_Error_string and MPI_Error_class of code.
func errorString(code int) (string, int) {
	buf := make([]byte, int(C.hv_max_error_string())+1)
	var cls C.int
	C.hv_error_string(C.int(code), (*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)), &cls)
	s, _, _ := strings.Cut(string(buf), "\x00")
	return s, int(cls)
}

// libraryVersion returns MPI_Get_library_version's text, first line only.
func libraryVersion() string {
	buf := make([]byte, 8192)
	if C.hv_library_version((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf))) != 0 {
		return ""
	}
	s, _, _ := strings.Cut(string(buf), "\x00")
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}
