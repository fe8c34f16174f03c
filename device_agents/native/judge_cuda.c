/* The CUDA device of a judge kernel child: see judge_cuda.h. The driver API through dlopen, so the
 * agent builds and runs on machines without CUDA and links nothing of NVIDIA's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "judge_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { ATTR_L2_CACHE_SIZE = 38, ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76 };

static struct {
  void* lib;
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(int*, int);
  CUresult (*DeviceGetAttribute)(int*, int, int);
  CUresult (*DeviceGetName)(char*, int, int);
  CUresult (*PrimaryCtxRetain)(void**, int);
  CUresult (*CtxSetCurrent)(void*);
  CUresult (*CtxSynchronize)(void);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemsetD32)(CUdeviceptr, unsigned int, size_t);
  CUresult (*EventCreate)(void**, unsigned);
  CUresult (*EventRecord)(void*, void*);
  CUresult (*EventSynchronize)(void*);
  CUresult (*EventElapsedTime)(float*, void*, void*);
  CUresult (*GetErrorName)(CUresult, const char**);
} cu;

static const char* err_name(CUresult r) {
  const char* n = NULL;
  if (cu.GetErrorName && cu.GetErrorName(r, &n) == 0 && n) return n;
  return "CUDA error";
}

#define CU(call, what)                                                                   \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_) {                                                                            \
      snprintf(err, errlen, "%s: %s (%d)", what, err_name(r_), r_);                      \
      return -1;                                                                         \
    }                                                                                    \
  } while (0)

int jc_open(jcuda* g, const char* driver, int ordinal, char* err, size_t errlen) {
  memset(g, 0, sizeof *g);
  g->ordinal = ordinal;
  cu.lib = dlopen(driver && *driver ? driver : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cu.lib) {
    const char* why = dlerror();
    snprintf(err, errlen, "no CUDA driver: %s", why ? why : "dlopen failed");
    return -1;
  }
  struct {
    void** slot;
    const char* names[2];
  } syms[] = {
      {(void**)&cu.Init, {"cuInit", NULL}},
      {(void**)&cu.DeviceGet, {"cuDeviceGet", NULL}},
      {(void**)&cu.DeviceGetAttribute, {"cuDeviceGetAttribute", NULL}},
      {(void**)&cu.DeviceGetName, {"cuDeviceGetName", NULL}},
      {(void**)&cu.PrimaryCtxRetain, {"cuDevicePrimaryCtxRetain", NULL}},
      {(void**)&cu.CtxSetCurrent, {"cuCtxSetCurrent", NULL}},
      {(void**)&cu.CtxSynchronize, {"cuCtxSynchronize", NULL}},
      {(void**)&cu.MemAlloc, {"cuMemAlloc_v2", "cuMemAlloc"}},
      {(void**)&cu.MemcpyHtoD, {"cuMemcpyHtoD_v2", "cuMemcpyHtoD"}},
      {(void**)&cu.MemcpyDtoH, {"cuMemcpyDtoH_v2", "cuMemcpyDtoH"}},
      {(void**)&cu.MemsetD8, {"cuMemsetD8_v2", "cuMemsetD8"}},
      {(void**)&cu.MemsetD32, {"cuMemsetD32_v2", "cuMemsetD32"}},
      {(void**)&cu.EventCreate, {"cuEventCreate", NULL}},
      {(void**)&cu.EventRecord, {"cuEventRecord", NULL}},
      {(void**)&cu.EventSynchronize, {"cuEventSynchronize", NULL}},
      {(void**)&cu.EventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
      {(void**)&cu.GetErrorName, {"cuGetErrorName", NULL}},
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    *syms[i].slot = dlsym(cu.lib, syms[i].names[0]);
    if (!*syms[i].slot && syms[i].names[1]) *syms[i].slot = dlsym(cu.lib, syms[i].names[1]);
    if (!*syms[i].slot) {
      snprintf(err, errlen, "the CUDA driver has no %s", syms[i].names[0]);
      return -1;
    }
  }
  CU(cu.Init(0), "cuInit");
  int dev = 0;
  CU(cu.DeviceGet(&dev, ordinal), "cuDeviceGet");
  void* ctx = NULL;
  CU(cu.PrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  CU(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
  if (cu.DeviceGetName(g->name, (int)sizeof g->name - 1, dev)) snprintf(g->name, sizeof g->name, "GPU %d", ordinal);
  int major = 0, minor = 0, l2 = 0;
  CU(cu.DeviceGetAttribute(&major, ATTR_CC_MAJOR, dev), "cuDeviceGetAttribute");
  CU(cu.DeviceGetAttribute(&minor, ATTR_CC_MINOR, dev), "cuDeviceGetAttribute");
  CU(cu.DeviceGetAttribute(&l2, ATTR_L2_CACHE_SIZE, dev), "cuDeviceGetAttribute");
  g->sm = major * 10 + minor;
  g->l2_bytes = l2 > 0 ? (size_t)l2 : 0;
  CU(cu.EventCreate(&g->ev0, 0), "cuEventCreate");
  CU(cu.EventCreate(&g->ev1, 0), "cuEventCreate");
  g->scratch_len = g->l2_bytes ? 2 * g->l2_bytes : 0;
  if (g->scratch_len) CU(cu.MemAlloc(&g->scratch, g->scratch_len), "cuMemAlloc (L2 scratch)");
  return 0;
}

int jc_alloc(jcuda* g, size_t nbytes, char* err, size_t errlen) {
  if (g->n >= JC_MAX_BUFS) {
    snprintf(err, errlen, "too many device buffers");
    return -1;
  }
  size_t body = (nbytes + 255) / 256 * 256;
  if (!body) body = 256;
  size_t len = JC_GUARD + body + JC_GUARD;
  CUdeviceptr p = 0;
  CU(cu.MemAlloc(&p, len), "cuMemAlloc");
  CU(cu.MemsetD32(p, JC_PATTERN, len / 4), "cuMemsetD32");
  CU(cu.CtxSynchronize(), "cuCtxSynchronize");
  int i = g->n++;
  g->base[i] = p;
  g->nbytes[i] = nbytes;
  g->len[i] = len;
  if (len > g->tmp_len) {
    free(g->tmp);
    g->tmp = (unsigned char*)malloc(len);
    g->tmp_len = g->tmp ? len : 0;
    if (!g->tmp) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
  }
  return i;
}

unsigned long long jc_data(const jcuda* g, int i) { return g->base[i] + JC_GUARD; }

int jc_upload(jcuda* g, int i, const void* host, char* err, size_t errlen) {
  if (g->nbytes[i]) CU(cu.MemcpyHtoD(jc_data(g, i), host, g->nbytes[i]), "cuMemcpyHtoD");
  return 0;
}

int jc_download(jcuda* g, int i, void* host, char* err, size_t errlen) {
  if (g->nbytes[i]) CU(cu.MemcpyDtoH(host, jc_data(g, i), g->nbytes[i]), "cuMemcpyDtoH");
  return 0;
}

int jc_poison(jcuda* g, int i, char* err, size_t errlen) {
  if (g->nbytes[i] >= 4) CU(cu.MemsetD32(jc_data(g, i), JC_PATTERN, g->nbytes[i] / 4), "cuMemsetD32");
  else if (g->nbytes[i]) CU(cu.MemsetD8(jc_data(g, i), 0xFF, g->nbytes[i]), "cuMemsetD8");
  return 0;
}

int jc_flush_l2(jcuda* g, char* err, size_t errlen) {
  if (g->scratch_len) CU(cu.MemsetD8(g->scratch, (unsigned char)(++g->flush_seq), g->scratch_len), "cuMemsetD8 (L2)");
  return 0;
}

int jc_record(jcuda* g, int which) { return cu.EventRecord(which ? g->ev1 : g->ev0, NULL); }

int jc_sync(jcuda* g, char* name, size_t namelen) {
  (void)g;
  CUresult r = cu.CtxSynchronize();
  if (r) snprintf(name, namelen, "%s (%d)", err_name(r), r);
  return r;
}

double jc_elapsed_ns(jcuda* g) {
  float ms = -1;
  if (cu.EventSynchronize(g->ev1) || cu.EventElapsedTime(&ms, g->ev0, g->ev1) || ms < 0) return -1;
  return (double)ms * 1e6;
}

static int word_ok(const unsigned char* p, size_t at) {
  static const uint32_t pat = JC_PATTERN;
  return p[at] == ((const unsigned char*)&pat)[at % 4];
}

int jc_guards(jcuda* g, int i, int* after, size_t* off, char* err, size_t errlen) {
  CU(cu.MemcpyDtoH(g->tmp, g->base[i], g->len[i]), "cuMemcpyDtoH (guards)");
  for (size_t k = JC_GUARD; k-- > 0;) /* nearest the data first */
    if (!word_ok(g->tmp, k)) {
      *after = 0;
      *off = JC_GUARD - k;
      return 1;
    }
  for (size_t k = JC_GUARD + g->nbytes[i]; k < g->len[i]; k++)
    if (!word_ok(g->tmp, k)) {
      *after = 1;
      *off = k - (JC_GUARD + g->nbytes[i]);
      return 1;
    }
  return 0;
}

int jc_compare(jcuda* g, int i, const void* host, size_t* off, char* err, size_t errlen) {
  if (!g->nbytes[i]) return 0;
  CU(cu.MemcpyDtoH(g->tmp, jc_data(g, i), g->nbytes[i]), "cuMemcpyDtoH (inputs)");
  const unsigned char* h = (const unsigned char*)host;
  for (size_t k = 0; k < g->nbytes[i]; k++)
    if (g->tmp[k] != h[k]) {
      *off = k;
      return 1;
    }
  return 0;
}
