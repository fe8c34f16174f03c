/* The CUDA device of a judge kernel child (judge_backend.c, params.device "cuda"): the CUDA driver
 * API (libcuda.so.1, always there where an NVIDIA driver is), loaded and initialised by the child
 * BEFORE its sandbox (the driver opens /dev/nvidia* for writing and starts threads), never by the
 * agent itself (a process that forks must not hold a CUDA context).
 *
 * Every device buffer is [guard | data | slack | guard], the guards and slack filled with a NaN
 * pattern: a read out of bounds pollutes the result, a write there is found by jc_guards. */
#ifndef EDGETUNE_JUDGE_CUDA_H_
#define EDGETUNE_JUDGE_CUDA_H_

#include <stddef.h>
#include <stdint.h>

#define JC_MAX_BUFS 256
#define JC_GUARD 4096u           /* bytes of guard before and after each buffer's data */
#define JC_PATTERN 0xFFC0A5E1u   /* a quiet NaN as float32 */

typedef struct {
  int ordinal;
  char name[128];
  int sm;                  /* 90 for sm_90 */
  size_t l2_bytes;
  int n;
  unsigned long long base[JC_MAX_BUFS]; /* CUdeviceptr of the guard before the data */
  size_t nbytes[JC_MAX_BUFS], len[JC_MAX_BUFS];
  unsigned long long scratch; /* twice the L2: written between runs, so no run finds its data cached */
  size_t scratch_len;
  unsigned flush_seq;
  void* ev0;
  void* ev1;
  unsigned char* tmp; /* host scratch for comparisons */
  size_t tmp_len;
} jcuda;

/* dlopen the driver (a path, or "libcuda.so.1"), cuInit, the device's primary context current on
 * this thread, its name / SM / L2, two events, the L2 scratch. 0, or -1 with err. */
int jc_open(jcuda* g, const char* driver, int ordinal, char* err, size_t errlen);
/* a guarded device buffer of nbytes: its index, or -1 with err */
int jc_alloc(jcuda* g, size_t nbytes, char* err, size_t errlen);
unsigned long long jc_data(const jcuda* g, int i);
int jc_upload(jcuda* g, int i, const void* host, char* err, size_t errlen);
int jc_download(jcuda* g, int i, void* host, char* err, size_t errlen);
int jc_poison(jcuda* g, int i, char* err, size_t errlen); /* the data: NaN */
int jc_flush_l2(jcuda* g, char* err, size_t errlen);
int jc_record(jcuda* g, int which); /* event 0 or 1 on the legacy default stream */
/* cuCtxSynchronize: 0, or the CUresult with its name ("CUDA_ERROR_ILLEGAL_ADDRESS") in name */
int jc_sync(jcuda* g, char* name, size_t namelen);
double jc_elapsed_ns(jcuda* g); /* between the two events (after jc_sync), -1 when unknown */
/* 0: buffer i's guards and slack intact; 1: overwritten, *after (0: before the data), *off bytes from
 * the data's edge; -1: a driver error in err */
int jc_guards(jcuda* g, int i, int* after, size_t* off, char* err, size_t errlen);
/* 0: the device data equals host; 1: differs first at byte *off; -1: error */
int jc_compare(jcuda* g, int i, const void* host, size_t* off, char* err, size_t errlen);

#endif
