/* The app loader's onnxruntime: the library (dlopen, its API version), the session options, the session. */
#include "loader_internal.h"

static const uint32_t kApiVersions[] = {17, 16, 14, 13, 12};

int ld_ort_check(et_session* s, OrtStatus* st, const char* what, char* err, size_t errlen) {
  if (!st) return 0;
  const char* msg = ORT_FN(s->api, ORT_GetErrorMessage, OrtGetErrorMessageFn)(st);
  ld_fail(err, errlen, "onnxruntime %s: %s", what, msg ? msg : "unknown error");
  ORT_FN(s->api, ORT_ReleaseStatus, OrtReleaseFn)(st);
  return -1;
}

/* ------------------------------------------------------------------ onnxruntime */

int ld_load_ort(et_session* s, const char* lib, char* err, size_t errlen) {
  s->dl = dlopen(lib ? lib : "libonnxruntime.so", RTLD_NOW | RTLD_LOCAL);
  if (!s->dl) {
    const char* why = dlerror();
    return ld_fail(err, errlen, "cannot load onnxruntime (%s): %s", lib ? lib : "libonnxruntime.so", why ? why : "dlopen failed");
  }
  OrtGetApiBaseFn get = (OrtGetApiBaseFn)dlsym(s->dl, "OrtGetApiBase");
  const OrtApiBase* base = get ? get() : NULL;
  if (!base) return ld_fail(err, errlen, "%s is not onnxruntime (no OrtGetApiBase)", lib ? lib : "libonnxruntime.so");
  if (base->GetVersionString) snprintf(s->version, sizeof s->version, "%s", base->GetVersionString());
  for (size_t i = 0; !s->api && i < sizeof kApiVersions / sizeof kApiVersions[0]; i++) {
    s->api = base->GetApi(kApiVersions[i]);
    s->api_version = kApiVersions[i];
  }
  if (!s->api) return ld_fail(err, errlen, "onnxruntime %s is too old for the loader (needs C API 12, onnxruntime 1.12)", s->version);
  return ld_ort_check(s, ORT_FN(s->api, ORT_CreateEnv, OrtCreateEnvFn)(ORT_LOGGING_LEVEL_ERROR, "edgetune", &s->env),
                   "CreateEnv", err, errlen);
}

/* the configuration's execution provider (the CPU provider needs nothing) */
static int append_provider(et_session* s, OrtSessionOptions* o, char* err, size_t errlen) {
  const OrtApi* a = s->api;
  const jval* po = json_get(s->config, "provider_options");
  if (!strcmp(s->provider, "CPUExecutionProvider")) return 0;
  if (!strcmp(s->provider, "NnapiExecutionProvider")) {
    /* NNAPI is appended through its own exported function; its option is a flags word (0: none) */
    typedef OrtStatus* (*NnapiFn)(OrtSessionOptions*, uint32_t);
    NnapiFn nnapi = (NnapiFn)dlsym(s->dl, "OrtSessionOptionsAppendExecutionProvider_Nnapi");
    double flags = 0;
    ld_num_of(json_get(po, "flags"), &flags);
    if (!nnapi) return ld_fail(err, errlen, "this onnxruntime %s has no NNAPI execution provider", s->version);
    return ld_ort_check(s, nnapi(o, (uint32_t)flags), s->provider, err, errlen);
  }
  /* the names SessionOptionsAppendExecutionProvider takes */
  static const char* const names[][2] = {{"XnnpackExecutionProvider", "XNNPACK"}, {"QNNExecutionProvider", "QNN"},
                                         {"SNPEExecutionProvider", "SNPE"}, {"CoreMLExecutionProvider", "CoreML"},
                                         {"OpenVINOExecutionProvider", "OpenVINO"}, {"WebNNExecutionProvider", "WEBNN"},
                                         {"VitisAIExecutionProvider", "VitisAI"}};
  const char* shortname = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(s->provider, names[i][0])) shortname = names[i][1];
  if (!shortname) return ld_fail(err, errlen, "execution provider %s is not one the loader can append", s->provider);
  const char* keys[64];
  const char* vals[64];
  size_t n = 0;
  for (size_t i = 0; po && po->type == J_OBJ && i < po->n && n < 64; i++) {
    if (!json_str(po->items[i])) return ld_fail(err, errlen, "provider_options values are strings");
    keys[n] = po->keys[i];
    vals[n++] = json_str(po->items[i]);
  }
  return ld_ort_check(s, ORT_FN(a, ORT_SessionOptionsAppendExecutionProvider, OrtAppendEpFn)(o, shortname, keys, vals, n),
                   s->provider, err, errlen);
}

static int make_options(et_session* s, const char* profile_prefix, OrtSessionOptions** out, char* err, size_t errlen) {
  const OrtApi* a = s->api;
  const jval* c = s->config;
  OrtSessionOptions* o = NULL;
  if (ld_ort_check(s, ORT_FN(a, ORT_CreateSessionOptions, OrtCreateSessionOptionsFn)(&o), "CreateSessionOptions", err, errlen))
    return -1;
  *out = o;
  double v;
  if (!ld_num_of(json_get(c, "intra_op_num_threads"), &v) &&
      ld_ort_check(s, ORT_FN(a, ORT_SetIntraOpNumThreads, OrtSetIntFn)(o, (int)v), "intra_op_num_threads", err, errlen))
    return -1;
  if (!ld_num_of(json_get(c, "inter_op_num_threads"), &v) &&
      ld_ort_check(s, ORT_FN(a, ORT_SetInterOpNumThreads, OrtSetIntFn)(o, (int)v), "inter_op_num_threads", err, errlen))
    return -1;
  if (!ld_num_of(json_get(c, "graph_optimization_level"), &v)) {
    if (v != 0 && v != 1 && v != 2 && v != 99) return ld_fail(err, errlen, "graph_optimization_level must be 0, 1, 2 or 99");
    if (ld_ort_check(s, ORT_FN(a, ORT_SetSessionGraphOptimizationLevel, OrtSetIntFn)(o, (int)v), "graph_optimization_level",
                  err, errlen))
      return -1;
  }
  const char* mode = json_str(json_get(c, "execution_mode"));
  if (mode) {
    int m = !strcmp(mode, "sequential") ? ORT_SEQUENTIAL : !strcmp(mode, "parallel") ? ORT_PARALLEL : -1;
    if (m < 0) return ld_fail(err, errlen, "execution_mode must be sequential or parallel");
    if (ld_ort_check(s, ORT_FN(a, ORT_SetSessionExecutionMode, OrtSetIntFn)(o, m), "execution_mode", err, errlen)) return -1;
  }
  const jval* entries = json_get(c, "session_config");
  for (size_t i = 0; entries && entries->type == J_OBJ && i < entries->n; i++) {
    const char* val = json_str(entries->items[i]);
    if (!val) return ld_fail(err, errlen, "session_config values are strings");
    if (ld_ort_check(s, ORT_FN(a, ORT_AddSessionConfigEntry, OrtAddConfigEntryFn)(o, entries->keys[i], val),
                  "AddSessionConfigEntry", err, errlen))
      return -1;
  }
  if (s->ops_lib[0]) {
    if (s->api_version < 14) return ld_fail(err, errlen, "onnxruntime %s cannot register a custom-op library (needs 1.14)", s->version);
    if (ld_ort_check(s, ORT_FN(a, ORT_RegisterCustomOpsLibrary_V2, OrtRegisterCustomOpsLibraryV2Fn)(o, s->ops_lib),
                  "RegisterCustomOpsLibrary_V2", err, errlen))
      return -1;
  }
  if (append_provider(s, o, err, errlen)) return -1;
  if (profile_prefix &&
      ld_ort_check(s, ORT_FN(a, ORT_EnableProfiling, OrtEnableProfilingFn)(o, profile_prefix), "EnableProfiling", err, errlen))
    return -1;
  return 0;
}

int ld_create_session(et_session* s, const char* profile_prefix, OrtSession** out, char* err, size_t errlen) {
  OrtSessionOptions* o = NULL;
  int rc = make_options(s, profile_prefix, &o, err, errlen);
  if (rc == 0)
    rc = ld_ort_check(s, ORT_FN(s->api, ORT_CreateSession, OrtCreateSessionFn)(s->env, s->model_path, o, out),
                   "CreateSession", err, errlen);
  if (o) ORT_FN(s->api, ORT_ReleaseSessionOptions, OrtReleaseFn)(o);
  return rc;
}
