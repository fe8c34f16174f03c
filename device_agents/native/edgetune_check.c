/* edgetune-check: runs an exported artifact the way an app does, through the artifact's own
 * loader library (dlopen'd, like System.loadLibrary), with no Python. `edgetune export check`
 * pushes it with the artifact and reads the one JSON object it prints.
 *
 *   edgetune-check --loader LIB --artifact DIR [--ort-lib PATH] [--shape KEY]
 *                  [--min-match exact|hardware|fallback] [--out DIR] [--warmup N] [--iters N]
 *                  [--budget-ms MS] [--placement]
 *
 * Exit 0 when it ran (the JSON says whether the golden outputs matched), 2 on an error (the JSON's
 * "error" says which). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edgetune_loader.h"
#include "json.h"

#define MAX_SAMPLES 20000

typedef struct {
  et_session* (*open)(const char*, const et_open_options*, char*, size_t);
  void (*close)(et_session*);
  const char* (*match_name)(const et_session*);
  const char* (*device)(const et_session*);
  const char* (*config_json)(const et_session*);
  const char* (*fingerprint)(const et_session*);
  const char* (*version)(const et_session*);
  int (*selftest)(et_session*, const char*, char*, size_t, char*, size_t);
  int (*bench)(et_session*, int, int, double, int64_t*, int, char*, size_t);
  int (*placement)(et_session*, const char*, char*, size_t, char*, size_t);
} loader_api;

static int finish(sbuf* o, const char* error) {
  sb_raw(o, ",\"error\":");
  sb_str(o, error);
  sb_raw(o, "}");
  puts(o->oom ? "{\"error\":\"out of memory\"}" : o->p);
  return error ? 2 : 0;
}

int main(int argc, char** argv) {
  const char *lib = NULL, *dir = NULL, *ort = NULL, *shape = NULL, *out = NULL, *min = "fallback";
  int warmup = 5, iters = 20, placement = 0;
  double budget_ms = 1000;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--placement")) { placement = 1; continue; }
    if (!v) { fprintf(stderr, "edgetune-check: %s needs a value\n", a); return 2; }
    i++;
    if (!strcmp(a, "--loader")) lib = v;
    else if (!strcmp(a, "--artifact")) dir = v;
    else if (!strcmp(a, "--ort-lib")) ort = v;
    else if (!strcmp(a, "--shape")) shape = v;
    else if (!strcmp(a, "--out")) out = v;
    else if (!strcmp(a, "--min-match")) min = v;
    else if (!strcmp(a, "--warmup")) warmup = atoi(v);
    else if (!strcmp(a, "--iters")) iters = atoi(v);
    else if (!strcmp(a, "--budget-ms")) budget_ms = atof(v);
    else { fprintf(stderr, "edgetune-check: unknown option %s\n", a); return 2; }
  }
  sbuf o;
  sb_init(&o);
  sb_printf(&o, "{\"loader_abi\":%d", ET_LOADER_ABI);
  if (!lib || !dir) return finish(&o, "give --loader LIB and --artifact DIR");
  int min_match = !strcmp(min, "exact") ? ET_MATCH_EXACT : !strcmp(min, "hardware") ? ET_MATCH_HARDWARE
                  : !strcmp(min, "fallback") ? ET_MATCH_FALLBACK : -1;
  if (min_match < 0) return finish(&o, "--min-match is exact, hardware or fallback");

  void* dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) return finish(&o, dlerror());
  loader_api L;
  void** slots = (void**)&L;
  static const char* names[] = {"et_open", "et_close", "et_match_name", "et_device", "et_config_json",
                                "et_fingerprint_json_of", "et_onnxruntime_version", "et_selftest", "et_bench",
                                "et_placement"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    slots[i] = dlsym(dl, names[i]);
    if (!slots[i]) {
      char msg[160];
      snprintf(msg, sizeof msg, "%s does not export %s (not an edgetune loader)", lib, names[i]);
      return finish(&o, msg);
    }
  }
  char err[1024] = "";
  et_open_options opts = {ort, shape, min_match, NULL};
  et_session* s = L.open(dir, &opts, err, sizeof err);
  if (!s) return finish(&o, err);
  sb_raw(&o, ",\"match\":");
  sb_str(&o, L.match_name(s));
  sb_raw(&o, ",\"device\":");
  sb_str(&o, L.device(s));
  sb_raw(&o, ",\"onnxruntime\":");
  sb_str(&o, L.version(s));
  sb_raw(&o, ",\"config\":");
  sb_raw(&o, L.config_json(s));
  sb_raw(&o, ",\"fingerprint\":");
  sb_raw(&o, L.fingerprint(s));

  static char report[1 << 16];
  int st = L.selftest(s, out, report, sizeof report, err, sizeof err);
  if (st < 0) { L.close(s); return finish(&o, err); }
  sb_raw(&o, ",\"selftest\":");
  sb_raw(&o, report);

  int64_t* samples = (int64_t*)malloc(sizeof(int64_t) * MAX_SAMPLES);
  if (!samples) { L.close(s); return finish(&o, "out of memory"); }
  int n = L.bench(s, warmup, iters, budget_ms, samples, MAX_SAMPLES, err, sizeof err);
  if (n < 0) { free(samples); L.close(s); return finish(&o, err); }
  sb_raw(&o, ",\"samples_ns\":[");
  for (int i = 0; i < n; i++) sb_printf(&o, "%s%lld", i ? "," : "", (long long)samples[i]);
  sb_raw(&o, "]");
  free(samples);

  if (placement) {
    static char where[1 << 14];
    sb_raw(&o, ",\"placement\":");
    if (L.placement(s, out ? out : ".", where, sizeof where, err, sizeof err) == 0) sb_raw(&o, where);
    else {
      sb_raw(&o, "{\"error\":");
      sb_str(&o, err);
      sb_raw(&o, "}");
    }
  }
  L.close(s);
  return finish(&o, NULL);
}
