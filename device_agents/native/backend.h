/* A backend runs one artifact: load once, then run(inputs -> outputs) many times. */
#ifndef EDGETUNE_BACKEND_H_
#define EDGETUNE_BACKEND_H_

#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "tensor.h"

typedef struct {
  const char* artifact;        /* absolute or JOBDIR-relative path, already sha256-checked */
  const char* artifact_sha256; /* lower-case hex */
  const jval* params;          /* JSON object (may be NULL) */
  const char** input_names;
  int n_inputs;
  const char** output_names;
  int n_outputs;
  const char* agent_dir;       /* directory holding the agent binary */
  double timeout_s;            /* limits.timeout_s of the job (0: none) */
} backend_config;

typedef struct backend backend;
struct backend {
  const char* name;
  /* 0 on success; on failure a one-line reason in err. */
  int (*load)(backend* b, const backend_config* cfg, char* err, size_t errlen);
  /* Bind one set of input/output tensors before running it (e.g. wrap them for the runtime). */
  int (*bind)(backend* b, et_tensor* in, et_tensor* out, char* err, size_t errlen);
  int (*run)(backend* b, char* err, size_t errlen);
  void (*unload)(backend* b);
  /* Writes `"name":"version"` pairs (comma-separated, no braces) for result.runtime_versions. */
  void (*versions)(backend* b, sbuf* out);
  /* Writes `"key":value` pairs for result.backend_info (how it ran: threads, linked kernel, ...). */
  void (*details)(backend* b, sbuf* out);
  void* state;
};

/* Optional hooks of a backend (backend_hooks_of; NULL: none): kept out of `backend` so the
 * backends' positional initializers stay complete. */
typedef struct {
  /* Allocate an input (is_input) or output buffer the backend's runtime will see; tensor_free frees
   * it. A backend with alloc is loaded after its buffers are allocated and bound. */
  int (*alloc)(backend* b, et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape, int is_input, char* err,
               size_t errlen);
  /* Outside the timed region, where the agent checks guard zones and once at the end: -1 with err set
   * when the backend saw the candidate break a rule (a fault). */
  int (*check)(backend* b, char* err, size_t errlen);
  /* A long pause of the run loop starts (the late-write wait): the backend may let helpers sleep. */
  void (*idle)(backend* b);
  /* 1 with a fault code ("forbidden-exec", ...) and a one-line detail when the candidate faulted. */
  int (*fault)(backend* b, char* code, size_t codelen, char* detail, size_t detaillen);
  /* The last run's time as the backend measured it in the agent's own process (the judge's CUDA mode:
   * the kernel call alone, without the untimed upload and download around it), or -1: the worker's
   * own clock around run(). Never a figure the candidate's process reported. */
  int64_t (*timed_ns)(backend* b);
} backend_hooks;
const backend_hooks* backend_hooks_of(const backend* b);

backend* backend_tvm_kernel(void);
backend* backend_ort(void);
/* Untrusted kernels in a sandboxed child process (judge_backend.c). A backend with `alloc` is loaded
 * after its buffers are allocated and bound. */
backend* backend_judge(void);
/* 0 when a forked child can install a seccomp filter here; else -1 and why (strerror). */
int judge_seccomp_probe(char* why, size_t whylen);

/* Parameter helpers: flat JSON scalars in request.params. */
int param_int(const jval* params, const char* key, long long* out); /* 0 if present & integral */
const char* param_str(const jval* params, const char* key);

/* onnxruntime discovery shared by `info` and the ort backend. */
int ort_find_library(const jval* params, const char* agent_dir, char* out, size_t outlen);
/* Version string of the library at path ("1.20.1"), or NULL; loads it. */
const char* ort_library_version(const char* path, char* buf, size_t buflen);

/* The TVM backend's thread pool (TVMBackendParallelLaunch runs on it). */
int et_pool_start(int nthreads, char* err, size_t errlen);
void et_pool_stop(void);

/* Number of online CPUs (>= 1). */
int cpu_count(void);

#endif
