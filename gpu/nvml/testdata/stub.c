// A stand-in for libnvidia-ml.so.1 with the ABI of nvml.h (NVML 12): two
// GPUs joined by two NVLinks (links 0 and 1; link 2 down; link 3 unused;
// INVALID_ARGUMENT from link 4), on one PCIe switch. gpu/nvml's abi_test
// builds it and points HVDD_NVML_LIBRARY at it, so that the purego binding
// (symbol names, argument and struct layouts, enum widths) is exercised
// without a GPU. Every call but nvmlInit fails with NVML_ERROR_UNINITIALIZED
// before nvmlInit or after nvmlShutdown. STUB_NVML_INIT=<n> makes nvmlInit
// return n.
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct stubDevice {
  int index;
} *nvmlDevice_t;

enum { OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7 };

static struct stubDevice devs[2] = {{0}, {1}};
static int inits;
static const char *bus[2] = {"00000000:3B:00.0", "00000000:5E:00.0"};

static int bad(nvmlDevice_t d) { return d != &devs[0] && d != &devs[1]; }

static nvmlReturn_t put(char *dst, unsigned int n, const char *s) {
  if (strlen(s) + 1 > n) return INSUFFICIENT_SIZE;
  strcpy(dst, s);
  return OK;
}

nvmlReturn_t nvmlInit_v2(void) {
  const char *e = getenv("STUB_NVML_INIT");
  if (e && atoi(e) != 0) return atoi(e);
  inits++;
  return OK;
}

nvmlReturn_t nvmlShutdown(void) {
  if (!inits) return UNINITIALIZED;
  inits--;
  return OK;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) {
  if (!inits) return UNINITIALIZED;
  return put(v, n, "550.54.15");
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
  if (!inits) return UNINITIALIZED;
  *v = 12040;
  return OK;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
  if (!inits) return UNINITIALIZED;
  *n = 2;
  return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  if (!inits) return UNINITIALIZED;
  if (i >= 2) return INVALID_ARGUMENT;
  *d = &devs[i];
  return OK;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int n) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  return put(s, n, d->index ? "GPU-11111111-2222-3333-4444-555555555555" : "GPU-00000000-2222-3333-4444-555555555555");
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int n) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  return put(s, n, "Stub H100 80GB HBM3");
}

static void pci(nvmlPciInfo_t *p, int i) {
  memset(p, 0, sizeof *p);
  strcpy(p->busIdLegacy, bus[i] + 4);
  strcpy(p->busId, bus[i]);
  p->bus = i ? 0x5e : 0x3b;
  p->pciDeviceId = 0x233010de;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  pci(p, d->index);
  return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  m->total = 85899345920ULL;
  m->used = 536870912ULL + (unsigned long long)d->index;
  m->free = m->total - m->used;
  return OK;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  *major = 9;
  *minor = 0;
  return OK;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
  if (!inits) return UNINITIALIZED;
  if (bad(d) || link >= 4) return INVALID_ARGUMENT;
  if (link == 3) return NOT_SUPPORTED;
  *active = link < 2;
  return OK;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *p) {
  if (!inits) return UNINITIALIZED;
  if (bad(d) || link >= 2) return INVALID_ARGUMENT;
  pci(p, 1 - d->index);
  return OK;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
  if (!inits) return UNINITIALIZED;
  if (bad(a) || bad(b) || a == b) return INVALID_ARGUMENT;
  *level = 20; // NVML_TOPOLOGY_MULTIPLE: PXB
  return OK;
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
  if (!inits) return UNINITIALIZED;
  if (bad(a) || bad(b) || a == b) return INVALID_ARGUMENT;
  // read OK, write disabled by regkey, NVLink OK: three distinct answers
  // tell the caps index reached C as an int.
  switch (index) {
  case 0: *status = 0; return OK;
  case 1: *status = 4; return OK;
  case 2: *status = 0; return OK;
  }
  return INVALID_ARGUMENT;
}
