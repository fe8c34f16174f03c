/* A backend runs one artifact: load once, then run(inputs -> outputs) many times. */
#ifndef EDGETUNE_BACKEND_H_
#define EDGETUNE_BACKEND_H_

#include <stddef.h>

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

backend* backend_tvm_kernel(void);
backend* backend_ort(void);

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
