/* edgetune's app loader (edgetune_loader.h): config.json -> fingerprint match -> sha256-checked
 * files -> an onnxruntime session with the selected configuration. C11, libc + dlopen only.
 * The artifact layout and the config.json schema are in docs/export.md. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "edgetune_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fingerprint.h"
#include "json.h"
#include "ort_abi.h"
#include "sha256.h"
#include "tensor.h"

#define API __attribute__((visibility("default")))
#define CONFIG_SCHEMA "edgetune.config/1"
#define MAX_IO 64

/* the slots beyond ort_abi.h's that only the loader uses (onnxruntime_c_api.h order; see ort_abi.h) */
enum {
  ORT_EnableProfiling = 14,
  ORT_AllocatorFree = 76,
  ORT_GetAllocatorWithDefaultOptions = 78,
  ORT_SessionEndProfiling = 110,    /* API 2 */
  ORT_AddSessionConfigEntry = 130,  /* API 5 */
  ORT_SessionOptionsAppendExecutionProvider = 216, /* API 12 */
};
typedef struct OrtAllocator OrtAllocator;
typedef OrtStatus* (*OrtEnableProfilingFn)(OrtSessionOptions*, const char* prefix);
typedef OrtStatus* (*OrtAllocatorFreeFn)(OrtAllocator*, void*);
typedef OrtStatus* (*OrtGetAllocatorFn)(OrtAllocator** out);
typedef OrtStatus* (*OrtSessionEndProfilingFn)(OrtSession*, OrtAllocator*, char** out);
typedef OrtStatus* (*OrtAddConfigEntryFn)(OrtSessionOptions*, const char* key, const char* value);
typedef OrtStatus* (*OrtAppendEpFn)(OrtSessionOptions*, const char* name, const char* const* keys,
                                    const char* const* values, size_t n);

static const uint32_t kApiVersions[] = {17, 16, 14, 13, 12};

typedef struct {
  char name[256];
  et_dtype dtype;
  int ndim;
  int64_t shape[ET_MAX_NDIM];
  size_t nbytes;
} io_spec;

struct et_session {
  jval* doc;
  const jval* config;  /* configs[id] */
  const jval* shape;   /* shapes[i] */
  const jval* accuracy; /* the device entry's accuracy budget for an approximate configuration, or NULL */
  int match;
  char device[256];
  char config_id[128];
  char* config_text;
  char fp_text[4096];
  char dir[PATH_MAX];
  char model_path[PATH_MAX];
  char ops_lib[PATH_MAX];
  char provider[128];
  /* onnxruntime */
  void* dl;
  const OrtApi* api;
  uint32_t api_version;
  char version[64];
  OrtEnv* env;
  OrtSession* sess;
  OrtMemoryInfo* mem;
  int n_in, n_out;
  io_spec in[MAX_IO], out[MAX_IO];
  const char* in_names[MAX_IO];
  const char* out_names[MAX_IO];
  /* golden inputs, loaded on first use */
  et_tensor golden_in[MAX_IO];
  int golden_loaded;
};

static int fail(char* err, size_t errlen, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char* err, size_t errlen, const char* fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int ort_check(et_session* s, OrtStatus* st, const char* what, char* err, size_t errlen) {
  if (!st) return 0;
  const char* msg = ORT_FN(s->api, ORT_GetErrorMessage, OrtGetErrorMessageFn)(st);
  fail(err, errlen, "onnxruntime %s: %s", what, msg ? msg : "unknown error");
  ORT_FN(s->api, ORT_ReleaseStatus, OrtReleaseFn)(st);
  return -1;
}

/* ------------------------------------------------------------------ config.json */

static const char* str_or(const jval* v, const char* dflt) {
  const char* s = json_str(v);
  return s ? s : dflt;
}

static int num_of(const jval* v, double* out) { return v && v->type == J_NUM ? (*out = v->num, 0) : -1; }

/* a path inside the artifact: relative, no "..", no empty part */
static int safe_rel(const char* p) {
  if (!p || !*p || p[0] == '/') return 0;
  const char* q = p;
  while (*q) {
    const char* slash = strchr(q, '/');
    size_t n = slash ? (size_t)(slash - q) : strlen(q);
    if (n == 0 || (n == 1 && q[0] == '.') || (n == 2 && q[0] == '.' && q[1] == '.')) return 0;
    q += n + (slash ? 1 : 0);
  }
  return 1;
}

static int join(const et_session* s, const char* rel, char* out, size_t outlen, char* err, size_t errlen) {
  if (!safe_rel(rel)) return fail(err, errlen, "config.json names a file outside the artifact: '%s'", rel ? rel : "(none)");
  if ((size_t)snprintf(out, outlen, "%s/%s", s->dir, rel) >= outlen) return fail(err, errlen, "path too long: %s", rel);
  return 0;
}

/* every file the configuration reads, checked against config.json's sha256 before onnxruntime sees it */
static int check_files(et_session* s, const jval* files, char* err, size_t errlen) {
  if (!files || files->type != J_ARR || files->n == 0)
    return fail(err, errlen, "config.json: configuration '%s' lists no files", s->config_id);
  for (size_t i = 0; i < files->n; i++) {
    const char* rel = json_str(json_get(files->items[i], "path"));
    const char* want = json_str(json_get(files->items[i], "sha256"));
    char path[PATH_MAX], hex[65];
    if (join(s, rel, path, sizeof path, err, errlen)) return -1;
    if (!want || strlen(want) != 64) return fail(err, errlen, "config.json: file '%s' has no sha256", rel);
    if (sha256_file_hex(path, hex)) return fail(err, errlen, "artifact file %s is missing or unreadable", rel);
    if (strcmp(hex, want))
      return fail(err, errlen, "artifact file %s is altered: sha256 %.12s..., config.json says %.12s...", rel, hex, want);
  }
  return 0;
}

static int same_str(const jval* v, const char* mine) {
  const char* s = json_str(v);
  if (!s || !*s) return !mine || !*mine; /* null and "" are the same absence */
  return mine && !strcmp(s, mine);
}

/* a code or model file the session loads must be one whose sha256 was checked */
static int listed(const jval* files, const char* rel) {
  for (size_t i = 0; rel && files && files->type == J_ARR && i < files->n; i++)
    if (same_str(json_get(files->items[i], "path"), rel)) return 1;
  return 0;
}

static int parse_io(const jval* list, io_spec* out, int* n, const char* what, char* err, size_t errlen) {
  if (!list || list->type != J_ARR || list->n == 0 || list->n > MAX_IO)
    return fail(err, errlen, "config.json: shape point has no %s", what);
  *n = (int)list->n;
  for (size_t i = 0; i < list->n; i++) {
    const jval* e = list->items[i];
    const char* name = json_str(json_get(e, "name"));
    const char* dt = json_str(json_get(e, "dtype"));
    const jval* shape = json_get(e, "shape");
    if (!name || !dt || !shape || shape->type != J_ARR || shape->n > ET_MAX_NDIM)
      return fail(err, errlen, "config.json: a malformed %s entry", what);
    io_spec* o = &out[i];
    snprintf(o->name, sizeof o->name, "%s", name);
    o->dtype = dtype_from_name(dt);
    if (o->dtype == DT_INVALID) return fail(err, errlen, "config.json: %s '%s' has dtype %s, which the loader does not run", what, name, dt);
    o->ndim = (int)shape->n;
    size_t count = 1;
    for (size_t d = 0; d < shape->n; d++) {
      double v;
      if (num_of(shape->items[d], &v) || v < 0 || v != floor(v))
        return fail(err, errlen, "config.json: %s '%s' has a non-static shape", what, name);
      o->shape[d] = (int64_t)v;
      count *= (size_t)v;
    }
    o->nbytes = count * dtype_size(o->dtype);
  }
  return 0;
}

/* ------------------------------------------------------------------ fingerprint match */


static int match_level(const jval* fp, const et_fingerprint* me) {
  if (!fp || fp->type != J_OBJ) return ET_MATCH_FALLBACK;
  double cores;
  if (!same_str(json_get(fp, "arch"), me->arch)) return ET_MATCH_FALLBACK;
  if (!same_str(json_get(fp, "cpu_model"), me->cpu_model) && !same_str(json_get(fp, "cpu_model"), me->cpu_model_py))
    return ET_MATCH_FALLBACK;
  if (num_of(json_get(fp, "cores"), &cores) || ((int)cores != me->cores && (int)cores != me->cores_online))
    return ET_MATCH_FALLBACK;
  const jval* f = json_get(fp, "max_freq_khz");
  if (f && f->type == J_ARR) {
    if ((int)f->n != me->n_freq) return ET_MATCH_FALLBACK;
    for (size_t i = 0; i < f->n; i++) {
      double v;
      if (num_of(f->items[i], &v) || (long long)v != me->max_freq_khz[i]) return ET_MATCH_FALLBACK;
    }
  }
  if (!same_str(json_get(fp, "kernel"), me->kernel) || !same_str(json_get(fp, "os"), me->os) ||
      !same_str(json_get(fp, "governor"), me->governor) || !same_str(json_get(fp, "emulated"), me->emulated) ||
      (!same_str(json_get(fp, "soc"), me->soc) && !same_str(json_get(fp, "soc"), me->soc_py)))
    return ET_MATCH_HARDWARE;
  return ET_MATCH_EXACT;
}

static const char* level_name(int m) {
  return m == ET_MATCH_EXACT ? "exact" : m == ET_MATCH_HARDWARE ? "hardware" : "fallback";
}

/* ------------------------------------------------------------------ onnxruntime */

static int load_ort(et_session* s, const char* lib, char* err, size_t errlen) {
  s->dl = dlopen(lib ? lib : "libonnxruntime.so", RTLD_NOW | RTLD_LOCAL);
  if (!s->dl) {
    const char* why = dlerror();
    return fail(err, errlen, "cannot load onnxruntime (%s): %s", lib ? lib : "libonnxruntime.so", why ? why : "dlopen failed");
  }
  OrtGetApiBaseFn get = (OrtGetApiBaseFn)dlsym(s->dl, "OrtGetApiBase");
  const OrtApiBase* base = get ? get() : NULL;
  if (!base) return fail(err, errlen, "%s is not onnxruntime (no OrtGetApiBase)", lib ? lib : "libonnxruntime.so");
  if (base->GetVersionString) snprintf(s->version, sizeof s->version, "%s", base->GetVersionString());
  for (size_t i = 0; !s->api && i < sizeof kApiVersions / sizeof kApiVersions[0]; i++) {
    s->api = base->GetApi(kApiVersions[i]);
    s->api_version = kApiVersions[i];
  }
  if (!s->api) return fail(err, errlen, "onnxruntime %s is too old for the loader (needs C API 12, onnxruntime 1.12)", s->version);
  return ort_check(s, ORT_FN(s->api, ORT_CreateEnv, OrtCreateEnvFn)(ORT_LOGGING_LEVEL_ERROR, "edgetune", &s->env),
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
    num_of(json_get(po, "flags"), &flags);
    if (!nnapi) return fail(err, errlen, "this onnxruntime %s has no NNAPI execution provider", s->version);
    return ort_check(s, nnapi(o, (uint32_t)flags), s->provider, err, errlen);
  }
  /* the names SessionOptionsAppendExecutionProvider takes */
  static const char* const names[][2] = {{"XnnpackExecutionProvider", "XNNPACK"}, {"QNNExecutionProvider", "QNN"},
                                         {"SNPEExecutionProvider", "SNPE"}, {"CoreMLExecutionProvider", "CoreML"},
                                         {"OpenVINOExecutionProvider", "OpenVINO"}, {"WebNNExecutionProvider", "WEBNN"},
                                         {"VitisAIExecutionProvider", "VitisAI"}};
  const char* shortname = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(s->provider, names[i][0])) shortname = names[i][1];
  if (!shortname) return fail(err, errlen, "execution provider %s is not one the loader can append", s->provider);
  const char* keys[64];
  const char* vals[64];
  size_t n = 0;
  for (size_t i = 0; po && po->type == J_OBJ && i < po->n && n < 64; i++) {
    if (!json_str(po->items[i])) return fail(err, errlen, "provider_options values are strings");
    keys[n] = po->keys[i];
    vals[n++] = json_str(po->items[i]);
  }
  return ort_check(s, ORT_FN(a, ORT_SessionOptionsAppendExecutionProvider, OrtAppendEpFn)(o, shortname, keys, vals, n),
                   s->provider, err, errlen);
}

static int make_options(et_session* s, const char* profile_prefix, OrtSessionOptions** out, char* err, size_t errlen) {
  const OrtApi* a = s->api;
  const jval* c = s->config;
  OrtSessionOptions* o = NULL;
  if (ort_check(s, ORT_FN(a, ORT_CreateSessionOptions, OrtCreateSessionOptionsFn)(&o), "CreateSessionOptions", err, errlen))
    return -1;
  *out = o;
  double v;
  if (!num_of(json_get(c, "intra_op_num_threads"), &v) &&
      ort_check(s, ORT_FN(a, ORT_SetIntraOpNumThreads, OrtSetIntFn)(o, (int)v), "intra_op_num_threads", err, errlen))
    return -1;
  if (!num_of(json_get(c, "inter_op_num_threads"), &v) &&
      ort_check(s, ORT_FN(a, ORT_SetInterOpNumThreads, OrtSetIntFn)(o, (int)v), "inter_op_num_threads", err, errlen))
    return -1;
  if (!num_of(json_get(c, "graph_optimization_level"), &v)) {
    if (v != 0 && v != 1 && v != 2 && v != 99) return fail(err, errlen, "graph_optimization_level must be 0, 1, 2 or 99");
    if (ort_check(s, ORT_FN(a, ORT_SetSessionGraphOptimizationLevel, OrtSetIntFn)(o, (int)v), "graph_optimization_level",
                  err, errlen))
      return -1;
  }
  const char* mode = json_str(json_get(c, "execution_mode"));
  if (mode) {
    int m = !strcmp(mode, "sequential") ? ORT_SEQUENTIAL : !strcmp(mode, "parallel") ? ORT_PARALLEL : -1;
    if (m < 0) return fail(err, errlen, "execution_mode must be sequential or parallel");
    if (ort_check(s, ORT_FN(a, ORT_SetSessionExecutionMode, OrtSetIntFn)(o, m), "execution_mode", err, errlen)) return -1;
  }
  const jval* entries = json_get(c, "session_config");
  for (size_t i = 0; entries && entries->type == J_OBJ && i < entries->n; i++) {
    const char* val = json_str(entries->items[i]);
    if (!val) return fail(err, errlen, "session_config values are strings");
    if (ort_check(s, ORT_FN(a, ORT_AddSessionConfigEntry, OrtAddConfigEntryFn)(o, entries->keys[i], val),
                  "AddSessionConfigEntry", err, errlen))
      return -1;
  }
  if (s->ops_lib[0]) {
    if (s->api_version < 14) return fail(err, errlen, "onnxruntime %s cannot register a custom-op library (needs 1.14)", s->version);
    if (ort_check(s, ORT_FN(a, ORT_RegisterCustomOpsLibrary_V2, OrtRegisterCustomOpsLibraryV2Fn)(o, s->ops_lib),
                  "RegisterCustomOpsLibrary_V2", err, errlen))
      return -1;
  }
  if (append_provider(s, o, err, errlen)) return -1;
  if (profile_prefix &&
      ort_check(s, ORT_FN(a, ORT_EnableProfiling, OrtEnableProfilingFn)(o, profile_prefix), "EnableProfiling", err, errlen))
    return -1;
  return 0;
}

static int create_session(et_session* s, const char* profile_prefix, OrtSession** out, char* err, size_t errlen) {
  OrtSessionOptions* o = NULL;
  int rc = make_options(s, profile_prefix, &o, err, errlen);
  if (rc == 0)
    rc = ort_check(s, ORT_FN(s->api, ORT_CreateSession, OrtCreateSessionFn)(s->env, s->model_path, o, out),
                   "CreateSession", err, errlen);
  if (o) ORT_FN(s->api, ORT_ReleaseSessionOptions, OrtReleaseFn)(o);
  return rc;
}

/* ------------------------------------------------------------------ open / close */

static char* slurp(const char* path, size_t max, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  char* buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      if (cap > max) { free(buf); fclose(f); return NULL; }
      cap = cap ? cap * 2 : 65536;
      char* nb = (char*)realloc(buf, cap);
      if (!nb) { free(buf); fclose(f); return NULL; }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    if (!got) break;
    n += got;
  }
  fclose(f);
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

API et_session* et_open(const char* artifact_dir, const et_open_options* opts, char* err, size_t errlen) {
  et_open_options dflt = {NULL, NULL, ET_MATCH_FALLBACK, NULL};
  if (!opts) opts = &dflt;
  et_session* s = (et_session*)calloc(1, sizeof *s);
  if (!s) { fail(err, errlen, "out of memory"); return NULL; }
  snprintf(s->dir, sizeof s->dir, "%s", artifact_dir && *artifact_dir ? artifact_dir : ".");
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.json", s->dir);
  char* text = slurp(path, 64u << 20, NULL);
  if (!text) { fail(err, errlen, "%s is missing or unreadable (not an edgetune artifact?)", path); goto bad; }
  char perr[256];
  s->doc = json_parse(text, perr, sizeof perr);
  free(text);
  if (!s->doc) { fail(err, errlen, "config.json is not valid JSON: %s", perr); goto bad; }
  if (!same_str(json_get(s->doc, "schema"), CONFIG_SCHEMA)) {
    fail(err, errlen, "config.json is not of schema %s", CONFIG_SCHEMA);
    goto bad;
  }

  /* the device: the best-matching tuned one, else the fallback */
  et_fingerprint me;
  et_fingerprint_collect(&me);
  {
    sbuf fb;
    sb_init(&fb);
    sb_raw(&fb, "{\"arch\":");
    sb_str(&fb, me.arch);
    sb_raw(&fb, ",\"fields\":");
    et_fingerprint_json(&fb, &me);
    sb_raw(&fb, "}");
    snprintf(s->fp_text, sizeof s->fp_text, "%s", fb.p ? fb.p : "{}");
    sb_free(&fb);
  }
  const jval* devices = json_get(s->doc, "devices");
  const jval* best = NULL;
  s->match = ET_MATCH_FALLBACK;
  for (size_t i = 0; devices && devices->type == J_ARR && i < devices->n; i++) {
    int m = match_level(json_get(devices->items[i], "fingerprint"), &me);
    if (m > s->match) { s->match = m; best = devices->items[i]; }
  }

  /* the shape point */
  const jval* shapes = json_get(s->doc, "shapes");
  if (!shapes || shapes->type != J_ARR || shapes->n == 0) { fail(err, errlen, "config.json lists no shape points"); goto bad; }
  for (size_t i = 0; i < shapes->n && !s->shape; i++)
    if (!opts->shape || same_str(json_get(shapes->items[i], "shape_key"), opts->shape)) s->shape = shapes->items[i];
  if (!s->shape) { fail(err, errlen, "the artifact has no shape point '%s'", opts->shape); goto bad; }
  const char* shape_key = str_or(json_get(s->shape, "shape_key"), "");

  /* the configuration: the device's for that shape point, else the fallback */
  const char* cid = NULL;
  if (best) {
    snprintf(s->device, sizeof s->device, "%s", str_or(json_get(best, "name"), ""));
    const jval* sel = json_get(best, "selected");
    for (size_t i = 0; sel && sel->type == J_ARR && i < sel->n && !cid; i++)
      if (same_str(json_get(sel->items[i], "shape_key"), shape_key)) {
        cid = json_str(json_get(sel->items[i], "config"));
        s->accuracy = json_get(sel->items[i], "accuracy");
        if (s->accuracy && s->accuracy->type != J_OBJ) s->accuracy = NULL;
      }
  }
  if (!cid) {
    cid = json_str(json_get(json_get(s->doc, "fallback"), "config"));
    s->accuracy = NULL;
    if (best) s->match = ET_MATCH_FALLBACK; /* that device was not tuned at this shape point */
    s->device[0] = 0;
  }
  if (s->match < opts->min_match) {
    if (best && !s->device[0])
      fail(err, errlen, "this device matches '%s' at the '%s' level, but that device was not tuned at shape point %s",
           str_or(json_get(best, "name"), "?"), level_name(match_level(json_get(best, "fingerprint"), &me)), shape_key);
    else
      fail(err, errlen, "this device (%s, %s, %d cores, kernel %s) matches none of the artifact's devices at the '%s' "
           "level (best: %s); it was tuned on %zu other device(s)", me.cpu_model, me.arch, me.cores, me.kernel,
           level_name(opts->min_match), level_name(s->match), devices && devices->type == J_ARR ? devices->n : 0);
    goto bad;
  }
  if (!cid) { fail(err, errlen, "config.json has no fallback configuration"); goto bad; }
  snprintf(s->config_id, sizeof s->config_id, "%s", cid);
  s->config = json_get(json_get(s->doc, "configs"), cid);
  if (!s->config || s->config->type != J_OBJ) { fail(err, errlen, "config.json: configuration '%s' is missing", cid); goto bad; }
  {
    const char* runtime = str_or(json_get(s->config, "runtime"), "");
    if (strcmp(runtime, "onnxruntime")) {
      fail(err, errlen, "configuration '%s' runs on '%s'; this loader runs onnxruntime configurations", cid, runtime);
      goto bad;
    }
  }
  if (check_files(s, json_get(s->config, "files"), err, errlen)) goto bad;
  if (join(s, json_str(json_get(s->config, "model")), s->model_path, sizeof s->model_path, err, errlen)) goto bad;
  if (!listed(json_get(s->config, "files"), json_str(json_get(s->config, "model")))) {
    fail(err, errlen, "configuration '%s': its model is not among the files whose sha256 config.json lists", cid);
    goto bad;
  }
  {
    const char* lib = json_str(json_get(s->config, "custom_ops_library"));
    if (lib && join(s, lib, s->ops_lib, sizeof s->ops_lib, err, errlen)) goto bad;
    if (lib && !listed(json_get(s->config, "files"), lib)) {
      fail(err, errlen, "configuration '%s': its custom-op library is not among the files whose sha256 config.json lists", cid);
      goto bad;
    }
  }
  snprintf(s->provider, sizeof s->provider, "%s", str_or(json_get(s->config, "execution_provider"), "CPUExecutionProvider"));
  if (parse_io(json_get(s->shape, "inputs"), s->in, &s->n_in, "inputs", err, errlen) ||
      parse_io(json_get(s->shape, "outputs"), s->out, &s->n_out, "outputs", err, errlen))
    goto bad;
  for (int i = 0; i < s->n_in; i++) s->in_names[i] = s->in[i].name;
  for (int i = 0; i < s->n_out; i++) s->out_names[i] = s->out[i].name;
  {
    sbuf cb;
    sb_init(&cb);
    sb_raw(&cb, "{\"id\":");
    sb_str(&cb, cid);
    sb_raw(&cb, ",\"execution_provider\":");
    sb_str(&cb, s->provider);
    double v;
    if (!num_of(json_get(s->config, "intra_op_num_threads"), &v)) sb_printf(&cb, ",\"intra_op_num_threads\":%d", (int)v);
    if (!num_of(json_get(s->config, "graph_optimization_level"), &v)) sb_printf(&cb, ",\"graph_optimization_level\":%d", (int)v);
    sb_raw(&cb, ",\"execution_mode\":");
    sb_str(&cb, json_str(json_get(s->config, "execution_mode")));
    sb_raw(&cb, ",\"model\":");
    sb_str(&cb, json_str(json_get(s->config, "model")));
    sb_raw(&cb, "}");
    s->config_text = cb.p; /* owned */
  }

  if (load_ort(s, opts->ort_library, err, errlen)) goto bad;
  if (create_session(s, opts->profile_prefix, &s->sess, err, errlen)) goto bad;
  if (ort_check(s, ORT_FN(s->api, ORT_CreateCpuMemoryInfo, OrtCreateCpuMemoryInfoFn)(OrtDeviceAllocator, OrtMemTypeDefault, &s->mem),
                "CreateCpuMemoryInfo", err, errlen))
    goto bad;
  return s;
bad:
  et_close(s);
  return NULL;
}

API void et_close(et_session* s) {
  if (!s) return;
  if (s->api) {
    if (s->sess) ORT_FN(s->api, ORT_ReleaseSession, OrtReleaseFn)(s->sess);
    if (s->mem) ORT_FN(s->api, ORT_ReleaseMemoryInfo, OrtReleaseFn)(s->mem);
    if (s->env) ORT_FN(s->api, ORT_ReleaseEnv, OrtReleaseFn)(s->env);
  }
  for (int i = 0; i < MAX_IO; i++) tensor_free(&s->golden_in[i]);
  if (s->doc) json_free(s->doc);
  free(s->config_text);
  /* the onnxruntime library stays loaded: its threads may outlive the session by a moment */
  free(s);
}

API int et_match(const et_session* s) { return s->match; }
API const char* et_match_name(const et_session* s) { return level_name(s->match); }
API const char* et_device(const et_session* s) { return s->device; }
API const char* et_config_id(const et_session* s) { return s->config_id; }
API const char* et_config_json(const et_session* s) { return s->config_text ? s->config_text : "{}"; }
API const char* et_fingerprint_json_of(const et_session* s) { return s->fp_text; }
API const char* et_onnxruntime_version(const et_session* s) { return s->version; }
API int et_num_inputs(const et_session* s) { return s->n_in; }
API int et_num_outputs(const et_session* s) { return s->n_out; }
API const char* et_input_name(const et_session* s, int i) { return i >= 0 && i < s->n_in ? s->in[i].name : NULL; }
API const char* et_output_name(const et_session* s, int i) { return i >= 0 && i < s->n_out ? s->out[i].name : NULL; }
API size_t et_input_bytes(const et_session* s, int i) { return i >= 0 && i < s->n_in ? s->in[i].nbytes : 0; }
API size_t et_output_bytes(const et_session* s, int i) { return i >= 0 && i < s->n_out ? s->out[i].nbytes : 0; }

/* ------------------------------------------------------------------ run */


static int run_session(et_session* s, OrtSession* sess, const void* const* inputs, void* const* outputs, char* err,
                       size_t errlen) {
  OrtValue* iv[MAX_IO] = {0};
  OrtValue* ov[MAX_IO] = {0};
  OrtCreateTensorWithDataFn wrap = ORT_FN(s->api, ORT_CreateTensorWithDataAsOrtValue, OrtCreateTensorWithDataFn);
  OrtReleaseFn rel = ORT_FN(s->api, ORT_ReleaseValue, OrtReleaseFn);
  int rc = 0;
  for (int i = 0; i < s->n_in && !rc; i++)
    rc = ort_check(s, wrap(s->mem, (void*)inputs[i], s->in[i].nbytes, s->in[i].shape, (size_t)s->in[i].ndim,
                           et_onnx_type(s->in[i].dtype), &iv[i]), "input", err, errlen);
  for (int i = 0; i < s->n_out && !rc; i++)
    rc = ort_check(s, wrap(s->mem, outputs[i], s->out[i].nbytes, s->out[i].shape, (size_t)s->out[i].ndim,
                           et_onnx_type(s->out[i].dtype), &ov[i]), "output", err, errlen);
  if (!rc)
    rc = ort_check(s, ORT_FN(s->api, ORT_Run, OrtRunFn)(sess, NULL, s->in_names, (const OrtValue* const*)iv, (size_t)s->n_in,
                                                        s->out_names, (size_t)s->n_out, ov),
                   "Run", err, errlen);
  /* onnxruntime writes into a pre-bound output only when it matches; make sure it did */
  for (int i = 0; i < s->n_out && !rc; i++) {
    void* p = NULL;
    rc = ort_check(s, ORT_FN(s->api, ORT_GetTensorMutableData, OrtGetTensorMutableDataFn)(ov[i], &p), "output", err, errlen);
    if (!rc && p != outputs[i]) rc = fail(err, errlen, "onnxruntime did not write output '%s' into the caller's buffer", s->out[i].name);
  }
  for (int i = 0; i < MAX_IO; i++) {
    if (iv[i]) rel(iv[i]);
    if (ov[i]) rel(ov[i]);
  }
  return rc;
}

API int et_run(et_session* s, const void* const* inputs, void* const* outputs, char* err, size_t errlen) {
  return run_session(s, s->sess, inputs, outputs, err, errlen);
}

/* ------------------------------------------------------------------ golden check */

static int load_golden(et_session* s, char* err, size_t errlen) {
  if (s->golden_loaded) return 0;
  const jval* files = json_get(json_get(s->shape, "golden"), "inputs");
  if (!files || files->type != J_ARR || (int)files->n != s->n_in) return fail(err, errlen, "config.json: no golden inputs for this shape point");
  for (int i = 0; i < s->n_in; i++) {
    char path[PATH_MAX], e[256];
    if (join(s, json_str(files->items[i]), path, sizeof path, err, errlen)) return -1;
    if (npy_read(path, &s->golden_in[i], e, sizeof e)) return fail(err, errlen, "golden input %s: %s", json_str(files->items[i]), e);
    et_tensor* t = &s->golden_in[i];
    int same = t->dtype == s->in[i].dtype && t->ndim == s->in[i].ndim && t->nbytes == s->in[i].nbytes;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == s->in[i].shape[d];
    if (!same) return fail(err, errlen, "golden input %s does not have the dtype and shape of input '%s'", json_str(files->items[i]), s->in[i].name);
  }
  s->golden_loaded = 1;
  return 0;
}

static double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(man + 1024, exp - 25);
  return sign ? -v : v;
}

static double element(const et_tensor* t, size_t i) {
  switch (t->dtype) {
    case DT_F32: return ((const float*)t->data)[i];
    case DT_F64: return ((const double*)t->data)[i];
    case DT_F16: return half_to_double(((const uint16_t*)t->data)[i]);
    case DT_I8: return ((const int8_t*)t->data)[i];
    case DT_U8: return ((const uint8_t*)t->data)[i];
    case DT_BOOL: return ((const uint8_t*)t->data)[i];
    case DT_I32: return ((const int32_t*)t->data)[i];
    case DT_I64: return (double)((const int64_t*)t->data)[i];
    default: return NAN;
  }
}

/* edgetune's tolerance rule (edgetune/verify.py compare): |y - r| <= atol * rms(r) + rtol * |r| for
 * every element, and ||y - r|| / ||r|| <= norm; a non-finite reference must be matched exactly */
typedef struct {
  double max_abs, norm_rel, worst_ratio, cosine;
  int within;
} errstats;

static errstats compare(const et_tensor* y, const et_tensor* r, double atol, double rtol, double norm) {
  errstats e = {0, 0, 0, 1, 1};
  size_t n = r->nbytes / dtype_size(r->dtype);
  double ss = 0, dd = 0, yy = 0, yr = 0;
  size_t finite = 0;
  for (size_t i = 0; i < n; i++) {
    double rv = element(r, i);
    if (isfinite(rv)) { ss += rv * rv; finite++; }
  }
  double scale = n ? sqrt(ss / (double)n) : 0;
  for (size_t i = 0; i < n; i++) {
    double yv = element(y, i), rv = element(r, i);
    double diff = isfinite(rv) ? fabs(yv - rv) : (yv == rv ? 0 : INFINITY);
    if (isnan(diff)) diff = INFINITY;
    if (diff > e.max_abs) e.max_abs = diff;
    double rf = isfinite(rv) ? rv : 0;
    dd += diff * diff;
    yy += (isfinite(yv) ? yv * yv : INFINITY);
    yr += (isfinite(yv) ? yv : 0) * rf;
    double bound = atol * scale + rtol * fabs(rf);
    double ratio = diff == 0 ? 0 : bound > 0 ? diff / bound : INFINITY;
    if (ratio > e.worst_ratio) e.worst_ratio = ratio;
  }
  (void)finite;
  double rn = sqrt(ss);
  e.norm_rel = rn > 0 ? sqrt(dd) / rn : (dd == 0 ? 0 : INFINITY);
  e.cosine = (rn > 0 && yy > 0 && isfinite(yy)) ? yr / (sqrt(yy) * rn) : (dd == 0 ? 1 : 0);
  e.within = e.worst_ratio <= 1.0 && e.norm_rel <= norm;
  return e;
}

API int et_selftest(et_session* s, const char* out_dir, char* report, size_t report_len, char* err, size_t errlen) {
  if (load_golden(s, err, errlen)) return -1;
  const jval* golden = json_get(s->shape, "golden");
  const jval* gout = json_get(golden, "outputs");
  const jval* tols = json_get(golden, "tolerance");
  if (!gout || gout->type != J_ARR || (int)gout->n != s->n_out || !tols || tols->type != J_ARR || (int)tols->n != s->n_out)
    return fail(err, errlen, "config.json: no golden outputs or tolerances for this shape point");
  et_tensor outs[MAX_IO], refs[MAX_IO];
  memset(outs, 0, sizeof outs);
  memset(refs, 0, sizeof refs);
  int rc = 0;
  const void* in_ptrs[MAX_IO];
  void* out_ptrs[MAX_IO];
  for (int i = 0; i < s->n_in; i++) in_ptrs[i] = s->golden_in[i].data;
  for (int i = 0; i < s->n_out && !rc; i++) {
    if (tensor_alloc(&outs[i], s->out[i].dtype, s->out[i].ndim, s->out[i].shape)) rc = fail(err, errlen, "out of memory");
    else {
      tensor_poison(&outs[i]); /* an output the session skips cannot pass as the golden one */
      out_ptrs[i] = outs[i].data;
    }
  }
  if (!rc) rc = et_run(s, in_ptrs, out_ptrs, err, errlen);
  sbuf o;
  sb_init(&o);
  int all_ok = 1;
  sb_raw(&o, "{\"outputs\":[");
  for (int i = 0; i < s->n_out && !rc; i++) {
    char path[PATH_MAX], e[256];
    const char* rel = json_str(gout->items[i]);
    if (join(s, rel, path, sizeof path, err, errlen)) { rc = -1; break; }
    if (npy_read(path, &refs[i], e, sizeof e)) { rc = fail(err, errlen, "golden output %s: %s", rel, e); break; }
    if (refs[i].dtype != outs[i].dtype || refs[i].nbytes != outs[i].nbytes) {
      rc = fail(err, errlen, "golden output %s does not have the dtype and size of output '%s'", rel, s->out[i].name);
      break;
    }
    double atol = 0, rtol = 0, norm = 0, mc = -2, ma = -1;
    num_of(json_get(tols->items[i], "atol"), &atol);
    num_of(json_get(tols->items[i], "rtol"), &rtol);
    num_of(json_get(tols->items[i], "norm"), &norm);
    errstats st = compare(&outs[i], &refs[i], atol, rtol, norm);
    int ok = st.within;
    const char* rule = "tolerance";
    if (s->accuracy) { /* an approximate configuration: held to the accuracy budget it was selected under */
      rule = "accuracy budget";
      ok = 1;
      if (!num_of(json_get(s->accuracy, "cosine"), &mc)) ok &= st.cosine >= mc;
      if (!num_of(json_get(s->accuracy, "max_abs"), &ma)) ok &= st.max_abs <= ma;
    }
    all_ok &= ok;
    sb_printf(&o, "%s{\"name\":", i ? "," : "");
    sb_str(&o, s->out[i].name);
    sb_printf(&o, ",\"ok\":%s,\"rule\":\"%s\",\"max_abs\":", ok ? "true" : "false", rule);
    sb_double(&o, st.max_abs);
    sb_raw(&o, ",\"norm_rel\":");
    sb_double(&o, st.norm_rel);
    sb_raw(&o, ",\"worst_ratio\":");
    sb_double(&o, st.worst_ratio);
    sb_raw(&o, ",\"cosine\":");
    sb_double(&o, st.cosine);
    sb_raw(&o, "}");
    if (out_dir) {
      snprintf(path, sizeof path, "%s/output_%d.npy", out_dir, i);
      if (npy_write(path, &outs[i], e, sizeof e)) { rc = fail(err, errlen, "writing %s: %s", path, e); break; }
    }
  }
  sb_printf(&o, "],\"ok\":%s}", all_ok ? "true" : "false");
  if (!rc && report && report_len) snprintf(report, report_len, "%s", o.p ? o.p : "{}");
  sb_free(&o);
  for (int i = 0; i < MAX_IO; i++) {
    tensor_free(&outs[i]);
    tensor_free(&refs[i]);
  }
  return rc ? -1 : (all_ok ? 0 : 1);
}

/* ------------------------------------------------------------------ timing */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

API int et_bench(et_session* s, int warmup, int min_iters, double budget_ms, int64_t* samples_ns, int max_samples,
                 char* err, size_t errlen) {
  if (load_golden(s, err, errlen)) return -1;
  et_tensor outs[MAX_IO];
  memset(outs, 0, sizeof outs);
  const void* in_ptrs[MAX_IO];
  void* out_ptrs[MAX_IO];
  int rc = 0, n = 0;
  for (int i = 0; i < s->n_in; i++) in_ptrs[i] = s->golden_in[i].data;
  for (int i = 0; i < s->n_out && !rc; i++) {
    if (tensor_alloc(&outs[i], s->out[i].dtype, s->out[i].ndim, s->out[i].shape)) rc = fail(err, errlen, "out of memory");
    out_ptrs[i] = outs[i].data;
  }
  for (int i = 0; i < warmup && !rc; i++) rc = et_run(s, in_ptrs, out_ptrs, err, errlen);
  int64_t start = now_ns();
  while (!rc && n < max_samples && (n < min_iters || (double)(now_ns() - start) < budget_ms * 1e6)) {
    int64_t t0 = now_ns();
    rc = et_run(s, in_ptrs, out_ptrs, err, errlen);
    samples_ns[n++] = now_ns() - t0;
  }
  for (int i = 0; i < MAX_IO; i++) tensor_free(&outs[i]);
  return rc ? -1 : n;
}

/* ------------------------------------------------------------------ placement */

static void strip_suffix(char* name) {
  static const char* suffixes[] = {"_kernel_time", "_fence_before", "_fence_after"};
  size_t n = strlen(name);
  for (size_t i = 0; i < 3; i++) {
    size_t k = strlen(suffixes[i]);
    if (n > k && !strcmp(name + n - k, suffixes[i])) { name[n - k] = 0; return; }
  }
}

API int et_placement(et_session* s, const char* work_dir, char* out, size_t outlen, char* err, size_t errlen) {
  if (load_golden(s, err, errlen)) return -1;
  char prefix[PATH_MAX];
  snprintf(prefix, sizeof prefix, "%s/edgetune-placement-%d", work_dir && *work_dir ? work_dir : ".", (int)getpid());
  OrtSession* ps = NULL;
  if (create_session(s, prefix, &ps, err, errlen)) return -1;
  et_tensor outs[MAX_IO];
  memset(outs, 0, sizeof outs);
  const void* in_ptrs[MAX_IO];
  void* out_ptrs[MAX_IO];
  int rc = 0;
  for (int i = 0; i < s->n_in; i++) in_ptrs[i] = s->golden_in[i].data;
  for (int i = 0; i < s->n_out && !rc; i++) {
    if (tensor_alloc(&outs[i], s->out[i].dtype, s->out[i].ndim, s->out[i].shape)) rc = fail(err, errlen, "out of memory");
    out_ptrs[i] = outs[i].data;
  }
  if (!rc) rc = run_session(s, ps, in_ptrs, out_ptrs, err, errlen);
  char* file = NULL;
  OrtAllocator* alloc = NULL;
  if (!rc) rc = ort_check(s, ORT_FN(s->api, ORT_GetAllocatorWithDefaultOptions, OrtGetAllocatorFn)(&alloc), "allocator", err, errlen);
  if (!rc) rc = ort_check(s, ORT_FN(s->api, ORT_SessionEndProfiling, OrtSessionEndProfilingFn)(ps, alloc, &file),
                          "SessionEndProfiling", err, errlen);
  ORT_FN(s->api, ORT_ReleaseSession, OrtReleaseFn)(ps);
  for (int i = 0; i < MAX_IO; i++) tensor_free(&outs[i]);
  if (rc) return -1;
  char* text = slurp(file, 256u << 20, NULL);
  if (text) unlink(file);
  char fname[PATH_MAX];
  snprintf(fname, sizeof fname, "%s", file);
  ORT_FN(s->api, ORT_AllocatorFree, OrtAllocatorFreeFn)(alloc, file);
  if (!text) return fail(err, errlen, "cannot read onnxruntime's profile %s", fname);
  char perr[128];
  jval* ev = json_parse(text, perr, sizeof perr);
  free(text);
  if (!ev || ev->type != J_ARR) {
    json_free(ev);
    return fail(err, errlen, "onnxruntime's profile is not a JSON array: %s", perr);
  }
  /* node name -> provider; then providers -> node counts */
  char** names = (char**)calloc(ev->n + 1, sizeof(char*));
  const char** provs = (const char**)calloc(ev->n + 1, sizeof(char*));
  size_t nn = 0;
  for (size_t i = 0; names && provs && i < ev->n; i++) {
    const jval* e = ev->items[i];
    const char* prov = json_str(json_get(json_get(e, "args"), "provider"));
    if (!same_str(json_get(e, "cat"), "Node") || !prov || !*prov) continue;
    char name[512];
    snprintf(name, sizeof name, "%s", str_or(json_get(e, "name"), ""));
    strip_suffix(name);
    size_t k = 0;
    while (k < nn && strcmp(names[k], name)) k++;
    if (k == nn) names[nn++] = strdup(name);
    provs[k] = prov;
  }
  sbuf o;
  sb_init(&o);
  sb_raw(&o, "{\"intended\":");
  sb_str(&o, s->provider);
  sb_raw(&o, ",\"nodes\":{");
  int first = 1;
  for (size_t k = 0; k < nn; k++) {
    int seen = 0;
    for (size_t j = 0; j < k; j++) seen |= !strcmp(provs[j], provs[k]);
    if (seen) continue;
    int count = 0;
    for (size_t j = k; j < nn; j++) count += !strcmp(provs[j], provs[k]);
    if (!first) sb_raw(&o, ",");
    first = 0;
    sb_str(&o, provs[k]);
    sb_printf(&o, ":%d", count);
  }
  sb_raw(&o, "}}");
  snprintf(out, outlen, "%s", o.p ? o.p : "{}");
  sb_free(&o);
  for (size_t k = 0; k < nn; k++) free(names[k]);
  free(names);
  free(provs);
  json_free(ev);
  return 0;
}
