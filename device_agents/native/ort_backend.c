/* Backend "ort": whole ONNX models through the device's own libonnxruntime.so (C API, dlopen).
 *
 * params: ort_lib (path), intra_op_num_threads, inter_op_num_threads, log_severity_level (0-4),
 *         graph_optimization_level (0/1/2/99), execution_mode ("sequential"/"parallel" or 0/1).
 * Outputs are bound to agent-owned buffers, so the agent poisons them before every run. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "ort_abi.h"

static const uint32_t kApiVersions[] = {16, 13, 10, 7, 4, 1};

static int is_file(const char* p) { return access(p, R_OK) == 0; }

int ort_find_library(const jval* params, const char* agent_dir, char* out, size_t outlen) {
  const char* p = param_str(params, "ort_lib");
  if (p && *p) { snprintf(out, outlen, "%s", p); return 0; } /* explicit: let dlopen report */
  p = getenv("EDGETUNE_ORT_LIB");
  if (p && *p) { snprintf(out, outlen, "%s", p); return 0; }
  if (!agent_dir) return -1;
  snprintf(out, outlen, "%s/libonnxruntime.so", agent_dir);
  if (is_file(out)) return 0;
  /* a versioned name as shipped in the wheel: libonnxruntime.so.1.20.1 */
  DIR* d = opendir(agent_dir);
  if (!d) return -1;
  struct dirent* e;
  int found = -1;
  while ((e = readdir(d))) {
    if (!strncmp(e->d_name, "libonnxruntime.so.", 18)) {
      snprintf(out, outlen, "%s/%s", agent_dir, e->d_name);
      found = 0;
      break;
    }
  }
  closedir(d);
  return found;
}

static const OrtApiBase* api_base(void* dl) {
  OrtGetApiBaseFn get = (OrtGetApiBaseFn)dlsym(dl, "OrtGetApiBase");
  return get ? get() : NULL;
}

const char* ort_library_version(const char* path, char* buf, size_t buflen) {
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) return NULL;
  const OrtApiBase* b = api_base(dl);
  const char* v = b && b->GetVersionString ? b->GetVersionString() : NULL;
  if (!v) return NULL;
  snprintf(buf, buflen, "%s", v);
  return buf; /* the library stays loaded; `info` exits right after */
}

typedef struct {
  void* dl;
  const OrtApi* api;
  uint32_t api_version;
  char version[64];
  OrtEnv* env;
  OrtSessionOptions* opts;
  OrtSession* sess;
  OrtMemoryInfo* mem;
  int n_in, n_out;
  const char** in_names;
  const char** out_names;
  OrtValue** in_vals;
  OrtValue** out_vals;
  et_tensor* outs; /* bound output tensors, to check ORT wrote into them */
} ort_state;

/* Consumes a status: 0 if OK, else -1 with its message in err. */
static int check(ort_state* s, OrtStatus* st, const char* what, char* err, size_t errlen) {
  if (!st) return 0;
  const char* msg = ORT_FN(s->api, ORT_GetErrorMessage, OrtGetErrorMessageFn)(st);
  snprintf(err, errlen, "%s: %s", what, msg ? msg : "unknown onnxruntime error");
  ORT_FN(s->api, ORT_ReleaseStatus, OrtReleaseFn)(st);
  return -1;
}


static int ort_load(backend* b, const backend_config* cfg, char* err, size_t errlen) {
  ort_state* s = (ort_state*)calloc(1, sizeof(ort_state));
  if (!s) { snprintf(err, errlen, "out of memory"); return -1; }
  b->state = s;
  char lib[PATH_MAX];
  if (ort_find_library(cfg->params, cfg->agent_dir, lib, sizeof lib)) {
    snprintf(err, errlen, "no libonnxruntime.so (set params.ort_lib or EDGETUNE_ORT_LIB, or put it next to the agent)");
    return -1;
  }
  s->dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!s->dl) {
    const char* why = dlerror();
    snprintf(err, errlen, "dlopen %s failed: %s", lib, why ? why : "unknown error");
    return -1;
  }
  const OrtApiBase* base = api_base(s->dl);
  if (!base) { snprintf(err, errlen, "%s has no OrtGetApiBase", lib); return -1; }
  if (base->GetVersionString) snprintf(s->version, sizeof s->version, "%s", base->GetVersionString());
  for (size_t i = 0; !s->api && i < sizeof kApiVersions / sizeof kApiVersions[0]; i++) {
    s->api = base->GetApi(kApiVersions[i]);
    s->api_version = kApiVersions[i];
  }
  if (!s->api) { snprintf(err, errlen, "onnxruntime %s offers no supported C API version", s->version); return -1; }
  const OrtApi* a = s->api;

  long long v;
  int log_level = ORT_LOGGING_LEVEL_ERROR; /* params.log_severity_level 0 (verbose) .. 4 (fatal) */
  if (param_int(cfg->params, "log_severity_level", &v) == 0 && v >= 0 && v <= 4) log_level = (int)v;
  if (check(s, ORT_FN(a, ORT_CreateEnv, OrtCreateEnvFn)(log_level, "edgetune", &s->env),
            "CreateEnv", err, errlen))
    return -1;
  if (check(s, ORT_FN(a, ORT_CreateSessionOptions, OrtCreateSessionOptionsFn)(&s->opts),
            "CreateSessionOptions", err, errlen))
    return -1;
  if (log_level != ORT_LOGGING_LEVEL_ERROR &&
      check(s, ORT_FN(a, ORT_SetSessionLogSeverityLevel, OrtSetIntFn)(s->opts, log_level), "log_severity_level", err, errlen))
    return -1;
  if (param_int(cfg->params, "intra_op_num_threads", &v) == 0 &&
      check(s, ORT_FN(a, ORT_SetIntraOpNumThreads, OrtSetIntFn)(s->opts, (int)v), "intra_op_num_threads", err, errlen))
    return -1;
  if (param_int(cfg->params, "inter_op_num_threads", &v) == 0 &&
      check(s, ORT_FN(a, ORT_SetInterOpNumThreads, OrtSetIntFn)(s->opts, (int)v), "inter_op_num_threads", err, errlen))
    return -1;
  if (param_int(cfg->params, "graph_optimization_level", &v) == 0) {
    if (v != 0 && v != 1 && v != 2 && v != 99) {
      snprintf(err, errlen, "graph_optimization_level must be 0, 1, 2 or 99");
      return -1;
    }
    if (check(s, ORT_FN(a, ORT_SetSessionGraphOptimizationLevel, OrtSetIntFn)(s->opts, (int)v),
              "graph_optimization_level", err, errlen))
      return -1;
  }
  const char* mode = param_str(cfg->params, "execution_mode");
  int m = -1;
  if (mode) m = !strcmp(mode, "sequential") ? ORT_SEQUENTIAL : !strcmp(mode, "parallel") ? ORT_PARALLEL : -2;
  else if (param_int(cfg->params, "execution_mode", &v) == 0) m = (v == 0 || v == 1) ? (int)v : -2;
  if (m == -2) { snprintf(err, errlen, "execution_mode must be sequential or parallel"); return -1; }
  if (m >= 0 && check(s, ORT_FN(a, ORT_SetSessionExecutionMode, OrtSetIntFn)(s->opts, m), "execution_mode", err, errlen))
    return -1;

  const char* ops_lib = param_str(cfg->params, "custom_ops_library");
  if (ops_lib) {
    /* a hybrid model's custom-op library (edgetune/space/ort_tvm.py): a plain file name next to
     * the model, whose sha256 the host checked when it pushed it */
    char path[PATH_MAX];
    const char* slash = strrchr(cfg->artifact, '/');
    if (!ops_lib[0] || strchr(ops_lib, '/') || !strcmp(ops_lib, ".") || !strcmp(ops_lib, "..")) {
      snprintf(err, errlen, "custom_ops_library must be a file name next to the model");
      return -1;
    }
    snprintf(path, sizeof path, "%.*s%s", slash ? (int)(slash - cfg->artifact + 1) : 0, cfg->artifact, ops_lib);
    if (s->api_version < 14) {
      snprintf(err, errlen, "onnxruntime %s cannot register a custom-op library (needs C API 14)", s->version);
      return -1;
    }
    if (check(s, ORT_FN(a, ORT_RegisterCustomOpsLibrary_V2, OrtRegisterCustomOpsLibraryV2Fn)(s->opts, path),
              "RegisterCustomOpsLibrary_V2", err, errlen))
      return -1;
  }

  if (check(s, ORT_FN(a, ORT_CreateSession, OrtCreateSessionFn)(s->env, cfg->artifact, s->opts, &s->sess),
            "CreateSession", err, errlen))
    return -1;
  size_t nin = 0, nout = 0;
  if (check(s, ORT_FN(a, ORT_SessionGetInputCount, OrtSessionCountFn)(s->sess, &nin), "SessionGetInputCount", err, errlen) ||
      check(s, ORT_FN(a, ORT_SessionGetOutputCount, OrtSessionCountFn)(s->sess, &nout), "SessionGetOutputCount", err, errlen))
    return -1;
  if ((int)nin != cfg->n_inputs) {
    snprintf(err, errlen, "model has %zu inputs, request gives %d", nin, cfg->n_inputs);
    return -1;
  }
  for (int i = 0; i < cfg->n_inputs; i++)
    if (!cfg->input_names[i]) { snprintf(err, errlen, "ort needs input_names"); return -1; }
  for (int i = 0; i < cfg->n_outputs; i++)
    if (!cfg->output_names[i]) { snprintf(err, errlen, "ort needs a name for every output"); return -1; }
  (void)nout; /* requesting a subset of the outputs is allowed */
  if (check(s, ORT_FN(a, ORT_CreateCpuMemoryInfo, OrtCreateCpuMemoryInfoFn)(OrtDeviceAllocator, OrtMemTypeDefault, &s->mem),
            "CreateCpuMemoryInfo", err, errlen))
    return -1;
  s->n_in = cfg->n_inputs;
  s->n_out = cfg->n_outputs;
  s->in_names = cfg->input_names;
  s->out_names = cfg->output_names;
  s->in_vals = (OrtValue**)calloc((size_t)s->n_in + 1, sizeof(OrtValue*));
  s->out_vals = (OrtValue**)calloc((size_t)s->n_out + 1, sizeof(OrtValue*));
  if (!s->in_vals || !s->out_vals) { snprintf(err, errlen, "out of memory"); return -1; }
  return 0;
}

static void release_values(ort_state* s) {
  OrtReleaseFn rel = ORT_FN(s->api, ORT_ReleaseValue, OrtReleaseFn);
  for (int i = 0; s->in_vals && i < s->n_in; i++) { if (s->in_vals[i]) rel(s->in_vals[i]); s->in_vals[i] = NULL; }
  for (int i = 0; s->out_vals && i < s->n_out; i++) { if (s->out_vals[i]) rel(s->out_vals[i]); s->out_vals[i] = NULL; }
}

static int wrap(ort_state* s, et_tensor* t, OrtValue** out, char* err, size_t errlen) {
  return check(s, ORT_FN(s->api, ORT_CreateTensorWithDataAsOrtValue, OrtCreateTensorWithDataFn)(
                      s->mem, t->data, t->nbytes, t->shape, (size_t)t->ndim, et_onnx_type(t->dtype), out),
               "CreateTensorWithDataAsOrtValue", err, errlen);
}

static int ort_bind(backend* b, et_tensor* in, et_tensor* out, char* err, size_t errlen) {
  ort_state* s = (ort_state*)b->state;
  release_values(s);
  for (int i = 0; i < s->n_in; i++)
    if (wrap(s, &in[i], &s->in_vals[i], err, errlen)) return -1;
  for (int i = 0; i < s->n_out; i++)
    if (wrap(s, &out[i], &s->out_vals[i], err, errlen)) return -1;
  s->outs = out;
  return 0;
}

static int ort_run(backend* b, char* err, size_t errlen) {
  ort_state* s = (ort_state*)b->state;
  if (check(s, ORT_FN(s->api, ORT_Run, OrtRunFn)(s->sess, NULL, s->in_names, (const OrtValue* const*)s->in_vals,
                                                  (size_t)s->n_in, s->out_names, (size_t)s->n_out, s->out_vals),
            "Run", err, errlen))
    return -1;
  /* ORT writes into a pre-bound output only when it matches; make sure it did */
  for (int i = 0; i < s->n_out; i++) {
    void* p = NULL;
    if (check(s, ORT_FN(s->api, ORT_GetTensorMutableData, OrtGetTensorMutableDataFn)(s->out_vals[i], &p),
              "GetTensorMutableData", err, errlen))
      return -1;
    if (p != s->outs[i].data) {
      snprintf(err, errlen, "onnxruntime did not write output '%s' into the bound buffer (dtype/shape mismatch?)",
               s->out_names[i]);
      return -1;
    }
  }
  return 0;
}

static void ort_unload(backend* b) {
  ort_state* s = (ort_state*)b->state;
  if (!s) return;
  if (s->api) {
    release_values(s);
    if (s->sess) ORT_FN(s->api, ORT_ReleaseSession, OrtReleaseFn)(s->sess);
    if (s->opts) ORT_FN(s->api, ORT_ReleaseSessionOptions, OrtReleaseFn)(s->opts);
    if (s->mem) ORT_FN(s->api, ORT_ReleaseMemoryInfo, OrtReleaseFn)(s->mem);
    if (s->env) ORT_FN(s->api, ORT_ReleaseEnv, OrtReleaseFn)(s->env);
  }
  free(s->in_vals);
  free(s->out_vals);
  free(s);
  b->state = NULL;
}

static void ort_versions(backend* b, sbuf* out) {
  ort_state* s = (ort_state*)b->state;
  sb_raw(out, "\"onnxruntime\":");
  sb_str(out, s && s->version[0] ? s->version : NULL);
}

backend* backend_ort(void) {
  static backend b = {"ort", ort_load, ort_bind, ort_run, ort_unload, ort_versions, NULL, NULL};
  return &b;
}
