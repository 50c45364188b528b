// A stand-in for libnvidia-ml.so.1 with the ABI of nvml.h (NVML 12): two
// GPUs joined by two NVLinks (links 0 and 1; link 2 down; link 3 unused;
// INVALID_ARGUMENT from link 4), on one PCIe switch. gpu/nvml's abi_test
// builds it and points HVDD_NVML_LIBRARY at it, so that go-nvml's binding
// as hvdd calls it (symbol names, argument and struct layouts, enum widths,
// event data) is exercised without a GPU; cmd/hvdd's tests run hvdd gpus on
// it. Every call but nvmlInit and nvmlErrorString fails with
// NVML_ERROR_UNINITIALIZED before nvmlInit or after nvmlShutdown.
// STUB_NVML_INIT=<n> makes nvmlInit return n.
//
// The sampler's calls: GPU 0 answers every figure (NVLink counters and ECC
// counts too); GPU 1 has no ECC (NOT_SUPPORTED) and no NVLink counter (its
// field values answer NOT_SUPPORTED each). Both register for XID events;
// STUB_NVML_XID=<n> queues one XID n event for GPU 1, read once.
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

enum { OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7, TIMEOUT = 10 };

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

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
  case OK: return "Success";
  case UNINITIALIZED: return "Uninitialized";
  case INVALID_ARGUMENT: return "Invalid Argument";
  case NOT_SUPPORTED: return "Not Supported";
  case INSUFFICIENT_SIZE: return "Insufficient Size";
  case TIMEOUT: return "Timeout";
  }
  return "Unknown Error";
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

// The sampler's calls.

typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned int fieldId, scopeId;
  long long timestamp, latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
  } value;
} nvmlFieldValue_t;
typedef struct stubEventSet {
  int registered; // a bit per GPU
  int xidRead;
} *nvmlEventSet_t;
typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

enum { XID_CRITICAL = 8, VALUE_ULL = 3, FI_NVLINK_DATA_TX = 138, FI_NVLINK_DATA_RX = 139 };

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  u->gpu = 40 + d->index;
  u->memory = 20 + d->index;
  return OK;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
  if (!inits) return UNINITIALIZED;
  if (bad(d) || sensor != 0) return INVALID_ARGUMENT; // NVML_TEMPERATURE_GPU
  *t = 55 + d->index;
  return OK;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  *mw = 350000 + d->index;
  return OK;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbps) {
  if (!inits) return UNINITIALIZED;
  if (bad(d) || counter < 0 || counter > 1) return INVALID_ARGUMENT; // TX_BYTES, RX_BYTES
  *kbps = counter ? 2000 : 1000;
  return OK;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int n, nvmlFieldValue_t *v) {
  if (!inits) return UNINITIALIZED;
  if (bad(d) || n <= 0) return INVALID_ARGUMENT;
  for (int i = 0; i < n; i++) {
    v[i].timestamp = 1;
    if (d->index == 1 || v[i].scopeId != 0xFFFFFFFFu ||
        (v[i].fieldId != FI_NVLINK_DATA_TX && v[i].fieldId != FI_NVLINK_DATA_RX)) {
      v[i].nvmlReturn = NOT_SUPPORTED;
      continue;
    }
    v[i].nvmlReturn = OK;
    v[i].valueType = VALUE_ULL;
    // More than 32 bits, so that a value read at the wrong width shows.
    v[i].value.ullVal = v[i].fieldId == FI_NVLINK_DATA_TX ? 0x100000001ULL : 0x200000002ULL;
  }
  return OK;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
  if (!inits) return UNINITIALIZED;
  if (bad(d) || type < 0 || type > 1 || counter != 0) return INVALID_ARGUMENT; // VOLATILE_ECC
  if (d->index == 1) return NOT_SUPPORTED;
  *n = type ? 0 : 3; // uncorrected, corrected
  return OK;
}

static struct stubEventSet eventSet;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
  if (!inits) return UNINITIALIZED;
  memset(&eventSet, 0, sizeof eventSet);
  *set = &eventSet;
  return OK;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  if (set != &eventSet) return INVALID_ARGUMENT;
  return OK;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
  if (!inits) return UNINITIALIZED;
  if (bad(d)) return INVALID_ARGUMENT;
  *types = XID_CRITICAL | 1; // and single-bit ECC errors
  return OK;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
  if (!inits) return UNINITIALIZED;
  if (bad(d) || set != &eventSet || types != XID_CRITICAL) return INVALID_ARGUMENT;
  set->registered |= 1 << d->index;
  return OK;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
  if (!inits) return UNINITIALIZED;
  if (set != &eventSet || timeoutms != 0) return INVALID_ARGUMENT; // the sampler never waits
  const char *e = getenv("STUB_NVML_XID");
  if (!e || set->xidRead || !(set->registered & 2)) return TIMEOUT;
  set->xidRead = 1;
  memset(data, 0, sizeof *data);
  data->device = &devs[1];
  data->eventType = XID_CRITICAL;
  data->eventData = strtoull(e, 0, 10);
  data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
  return OK;
}
