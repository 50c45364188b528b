// A stand-in for libcuda.so.1 and libnccl.so.2 with every symbol gpu/cuda
// binds, for abi_test.go: the functions that take structs by value or many
// arguments check what they receive and answer with values derived from
// it, so the test sees whether purego passed them as the C ABI says.
#include <stddef.h>
#include <stdint.h>

typedef struct { char reserved[64]; } ipc_t;
typedef struct { char internal[128]; } uid_t128;

static uint64_t sum64(const char *p, int n) {
	uint64_t s = 0;
	for (int i = 0; i < n; i++) s += (uint64_t)(unsigned char)p[i] * (uint64_t)(i + 1);
	return s;
}

#define OK(name, ...) int name(__VA_ARGS__) { return 0; }
OK(cuInit, unsigned f)
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int o) { *d = o; return 0; }
int cuDeviceGetName(char *s, int n, int d) { const char *x = "Stub GPU"; int i = 0; for (; x[i] && i < n - 1; i++) s[i] = x[i]; s[i] = 0; return 0; }
int cuDeviceGetUuid_v2(unsigned char *u, int d) { for (int i = 0; i < 16; i++) u[i] = (unsigned char)(i * 17); return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) { *v = attr == 75 ? 9 : attr == 76 ? 0 : -1; return 0; }
int cuDeviceTotalMem_v2(size_t *b, int d) { *b = (size_t)80 << 30; return 0; }
int cuDeviceGetPCIBusId(char *s, int n, int d) { const char *x = "0000:3b:00.0"; int i = 0; for (; x[i] && i < n - 1; i++) s[i] = x[i]; s[i] = 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)0xc0; return 0; }
OK(cuDevicePrimaryCtxRelease_v2, int d)
int cuCtxSetCurrent(void *c) { return c == (void *)0xc0 ? 0 : 201; }
int cuMemAlloc_v2(uint64_t *p, size_t n) { *p = 0x7000000000 + n; return 0; }
OK(cuMemFree_v2, uint64_t p)
OK(cuMemcpyHtoDAsync_v2, uint64_t d, const void *s, size_t n, void *st)
OK(cuMemcpyDtoHAsync_v2, void *d, uint64_t s, size_t n, void *st)
OK(cuMemcpyDtoDAsync_v2, uint64_t d, uint64_t s, size_t n, void *st)
int cuMemsetD8Async(uint64_t d, unsigned char v, size_t n, void *st) {
	return d == 0x1000 && v == 0xab && n == 77 && st == (void *)0x1234 ? 0 : 1;
}
OK(cuStreamCreate, void **s, unsigned f)
OK(cuStreamWaitEvent, void *s, void *e, unsigned f)
OK(cuStreamSynchronize, void *s)
OK(cuStreamDestroy_v2, void *s)
OK(cuEventCreate, void **e, unsigned f)
OK(cuEventRecord, void *e, void *s)
int cuEventQuery(void *e) { return 600; }
OK(cuEventSynchronize, void *e)
OK(cuEventDestroy_v2, void *e)
int cuIpcGetMemHandle(ipc_t *h, uint64_t p) { for (int i = 0; i < 64; i++) h->reserved[i] = (char)(p + i); return 0; }
int cuIpcOpenMemHandle_v2(uint64_t *p, ipc_t h, unsigned flags) {
	*p = sum64(h.reserved, 64);
	return flags == 1 ? 0 : 1;
}
OK(cuIpcCloseMemHandle, uint64_t p)
OK(cuIpcGetEventHandle, ipc_t *h, void *e)
int cuIpcOpenEventHandle(void **e, ipc_t h) { *e = (void *)(uintptr_t)sum64(h.reserved, 64); return 0; }
OK(cuModuleLoadData, void **m, const void *img)
int cuModuleGetFunction(void **f, void *m, const char *name) { *f = (void *)(uintptr_t)sum64(name, 3); return name[0] == 'k' ? 0 : 500; }
OK(cuModuleUnload, void *m)
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *st, void **params, void **extra) {
	if (gx != 7 || gy != 1 || gz != 1 || bx != 32 || by != 1 || bz != 1 || shmem != 0) return 11;
	if (st != (void *)0x1234 || extra != NULL) return 12;
	if (*(uint64_t *)params[0] != 0xdeadbeef0001ULL) return 13;
	if (*(uint64_t *)params[1] != 16) return 14;
	if (*(double *)params[2] != 2.5) return 15;
	if (*(int32_t *)params[3] != -3) return 16;
	if (*(float *)params[4] != 0.25f) return 17;
	return 0;
}
int cuGetErrorName(int r, const char **s) { *s = r == 600 ? "CUDA_ERROR_NOT_READY" : "CUDA_ERROR_STUB"; return 0; }
int cuGetErrorString(int r, const char **s) { *s = "stub error"; return 0; }

int ncclGetVersion(int *v) { *v = 21903; return 0; }
int ncclGetUniqueId(uid_t128 *id) { for (int i = 0; i < 128; i++) id->internal[i] = (char)(3 * i); return 0; }
int ncclCommInitRank(void **c, int nranks, uid_t128 id, int rank) {
	*c = (void *)(uintptr_t)(sum64(id.internal, 128) * 1000 + (uint64_t)nranks * 10 + (uint64_t)rank);
	return 0;
}
OK(ncclCommInitAll, void **c, int n, const int *devs)
OK(ncclGroupStart, void)
OK(ncclGroupEnd, void)
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st) {
	return s == (void *)0x10 && r == (void *)0x20 && n == 1000 && dt == 7 && op == 4 && c == (void *)0xcc && st == (void *)0x1234 ? 0 : 4;
}
OK(ncclBroadcast, const void *s, void *r, size_t n, int dt, int root, void *c, void *st)
int ncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, void *c, void *st) {
	return n == 5 && dt == 9 && op == 3 && root == 1 && c == (void *)0xcc && st == (void *)0x1234 ? 0 : 4;
}
OK(ncclAllGather, const void *s, void *r, size_t n, int dt, void *c, void *st)
OK(ncclReduceScatter, const void *s, void *r, size_t n, int dt, int op, void *c, void *st)
OK(ncclSend, const void *s, size_t n, int dt, int peer, void *c, void *st)
OK(ncclRecv, void *r, size_t n, int dt, int peer, void *c, void *st)
int ncclCommGetAsyncError(void *c, int *r) { *r = 6; return 0; }
OK(ncclCommAbort, void *c)
OK(ncclCommDestroy, void *c)
const char *ncclGetErrorString(int r) { return r == 6 ? "remote process exited or there was a network error" : "stub"; }
