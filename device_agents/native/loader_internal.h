/* What the app loader's files share (not part of its API: edgetune_loader.h is). The loader is
 * built with -fvisibility=hidden, so nothing here is exported from libedgetune_loader.so.
 *   edgetune_loader.c  et_open, et_close, the accessors, et_run
 *   loader_config.c    config.json: paths, files, inputs and outputs; the fingerprint match
 *   loader_ort.c       onnxruntime: the library, the session options, the session
 *   loader_check.c     et_selftest (the golden check), et_bench, et_placement */
#ifndef ET_LOADER_INTERNAL_H
#define ET_LOADER_INTERNAL_H
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


/* edgetune_loader.c */
int ld_fail(char* err, size_t errlen, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
char* ld_slurp(const char* path, size_t max, size_t* len);
int ld_run_session(et_session* s, OrtSession* sess, const void* const* inputs, void* const* outputs, char* err,
                   size_t errlen);

/* loader_config.c */
const char* ld_str_or(const jval* v, const char* dflt);
int ld_num_of(const jval* v, double* out);
int ld_join(const et_session* s, const char* rel, char* out, size_t outlen, char* err, size_t errlen);
int ld_check_files(et_session* s, const jval* files, char* err, size_t errlen);
int ld_same_str(const jval* v, const char* mine);
int ld_listed(const jval* files, const char* rel);
int ld_parse_io(const jval* list, io_spec* out, int* n, const char* what, char* err, size_t errlen);
int ld_match_level(const jval* fp, const et_fingerprint* me);
const char* ld_level_name(int m);

/* loader_ort.c */
int ld_ort_check(et_session* s, OrtStatus* st, const char* what, char* err, size_t errlen);
int ld_load_ort(et_session* s, const char* lib, char* err, size_t errlen);
int ld_create_session(et_session* s, const char* profile_prefix, OrtSession** out, char* err, size_t errlen);

#endif /* ET_LOADER_INTERNAL_H */
