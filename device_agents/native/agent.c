/* edgetune-agent: the native device agent (C11, libc only). Speaks device_agents/PROTOCOL.md.
 *
 *   edgetune-agent info          one JSON object describing the device and runtimes
 *   edgetune-agent run JOBDIR    run JOBDIR/request.json, write outputs and JOBDIR/result.json
 *   edgetune-agent version       the agent version
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "json.h"
#include "sha256.h"
#include "tensor.h"

#ifndef ET_AGENT_VERSION
#define ET_AGENT_VERSION "0.1.0"
#endif

#define ERRLEN 1024

/* ------------------------------------------------------------------ small utilities */

int cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int param_int(const jval* params, const char* key, long long* out) {
  double d;
  if (json_num(json_get(params, key), &d) != 0) {
    const char* s = json_str(json_get(params, key)); /* tolerate "4" */
    char* end;
    if (!s || !*s) return -1;
    long long v = strtoll(s, &end, 10);
    if (*end) return -1;
    *out = v;
    return 0;
  }
  if (d != floor(d) || fabs(d) > 9e15) return -1;
  *out = (long long)d;
  return 0;
}

const char* param_str(const jval* params, const char* key) {
  return json_str(json_get(params, key));
}

static char* read_text(const char* path, size_t max) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0;
  char* buf = (char*)malloc(cap);
  if (!buf) { fclose(f); return NULL; }
  for (;;) {
    if (len + 1 >= cap) {
      if (cap >= max) break;
      char* nb = (char*)realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
    size_t n = fread(buf + len, 1, cap - len - 1, f);
    if (n == 0) break;
    len += n;
  }
  fclose(f);
  buf[len] = 0;
  return buf;
}

static void trim(char* s) {
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  size_t i = 0;
  while (isspace((unsigned char)s[i])) i++;
  if (i) memmove(s, s + i, n - i + 1);
}

/* One "key : value" line of /proc/cpuinfo (first match), or "key=value" of a .prop file. */
static int field(const char* text, const char* key, char sep, char* out, size_t outlen) {
  size_t klen = strlen(key);
  for (const char* line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (strncmp(line, key, klen)) continue;
    const char* p = line + klen;
    while (*p == ' ' || *p == '\t') p++;
    if (*p != sep) continue;
    p++;
    size_t n = 0;
    while (p[n] && p[n] != '\n') n++;
    if (n >= outlen) n = outlen - 1;
    memcpy(out, p, n);
    out[n] = 0;
    trim(out);
    if (out[0] == '"' && n >= 2 && out[strlen(out) - 1] == '"') { /* os-release quoting */
      memmove(out, out + 1, strlen(out));
      out[strlen(out) - 1] = 0;
    }
    return 0;
  }
  return -1;
}

static long long read_ll(const char* path) {
  char* t = read_text(path, 4096);
  if (!t) return -1;
  char* end;
  long long v = strtoll(t, &end, 10);
  int ok = end != t;
  free(t);
  return ok ? v : -1;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void agent_dir(const char* argv0, char* out, size_t outlen) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = 0;
  } else {
    snprintf(buf, sizeof buf, "%s", argv0);
  }
  char* slash = strrchr(buf, '/');
  if (slash) *slash = 0;
  else snprintf(buf, sizeof buf, ".");
  snprintf(out, outlen, "%s", buf[0] ? buf : "/");
}

/* ------------------------------------------------------------------ info */

static void cpu_freqs(sbuf* out, const char* file, const char* when_none) {
  int n = (int)sysconf(_SC_NPROCESSORS_CONF), any = 0;
  sbuf tmp;
  sb_init(&tmp);
  sb_raw(&tmp, "[");
  for (int i = 0; i < n; i++) {
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cpufreq/%s", i, file);
    long long v = read_ll(path);
    if (v < 0) continue;
    sb_printf(&tmp, "%s%lld", any ? "," : "", v);
    any = 1;
  }
  sb_raw(&tmp, "]");
  sb_raw(out, any ? tmp.p : when_none);
  sb_free(&tmp);
}

static char* android_prop(const char* key, char* out, size_t outlen) {
  static const char* files[] = {"/system/build.prop", "/vendor/build.prop", "/odm/etc/build.prop",
                                "/product/etc/build.prop"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char* t = read_text(files[i], 1 << 20);
    if (!t) continue;
    int rc = field(t, key, '=', out, outlen);
    free(t);
    if (rc == 0 && out[0]) return out;
  }
  return NULL;
}

static void write_fingerprint(sbuf* o) {
  struct utsname u;
  uname(&u);
  char* cpuinfo = read_text("/proc/cpuinfo", 1 << 20);
  char model[256] = "", soc[256] = "", v[256];
  if (cpuinfo) {
    if (field(cpuinfo, "model name", ':', v, sizeof v) == 0) snprintf(model, sizeof model, "%s", v);
    else if (field(cpuinfo, "Processor", ':', v, sizeof v) == 0) snprintf(model, sizeof model, "%s", v);
    else if (field(cpuinfo, "cpu model", ':', v, sizeof v) == 0) snprintf(model, sizeof model, "%s", v);
    if (!model[0] || !strcmp(model, "AArch64 Processor")) {
      char impl[64], part[64];
      if (field(cpuinfo, "CPU implementer", ':', impl, sizeof impl) == 0 &&
          field(cpuinfo, "CPU part", ':', part, sizeof part) == 0)
        snprintf(model, sizeof model, "implementer %s part %s", impl, part);
    }
    if (field(cpuinfo, "Hardware", ':', v, sizeof v) == 0) snprintf(soc, sizeof soc, "%s", v);
  }
  if (!soc[0] && (android_prop("ro.soc.model", v, sizeof v) || android_prop("ro.board.platform", v, sizeof v)))
    snprintf(soc, sizeof soc, "%s", v);
  free(cpuinfo);
  if (!model[0]) snprintf(model, sizeof model, "%s", u.machine);

  char os[512] = "";
  char* osr = read_text("/etc/os-release", 1 << 16);
  if (osr && field(osr, "PRETTY_NAME", '=', v, sizeof v) == 0) snprintf(os, sizeof os, "%s", v);
  free(osr);
  if (!os[0]) {
    char rel[64], id[128];
    if (android_prop("ro.build.version.release", rel, sizeof rel)) {
      if (android_prop("ro.build.fingerprint", v, sizeof v)) snprintf(os, sizeof os, "Android %s (%s)", rel, v);
      else if (android_prop("ro.build.id", id, sizeof id)) snprintf(os, sizeof os, "Android %s (%s)", rel, id);
      else snprintf(os, sizeof os, "Android %s", rel);
    }
  }
  if (!os[0]) snprintf(os, sizeof os, "%s", u.sysname);

  char* gov = read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", 256);
  if (gov) trim(gov);

  sb_raw(o, "{\"cpu_model\":");
  sb_str(o, model);
  sb_raw(o, ",\"soc\":");
  sb_str(o, soc[0] ? soc : NULL);
  sb_printf(o, ",\"cores\":%d,\"max_freq_khz\":", (int)sysconf(_SC_NPROCESSORS_CONF));
  cpu_freqs(o, "cpuinfo_max_freq", "[]");
  sb_raw(o, ",\"kernel\":");
  sb_str(o, u.release);
  sb_raw(o, ",\"os\":");
  sb_str(o, os);
  sb_raw(o, ",\"governor\":");
  sb_str(o, gov && gov[0] ? gov : NULL);
  /* a board whose binaries run under emulation says so: its timings are never compared */
  const char* emu = getenv("EDGETUNE_EMULATED");
  sb_raw(o, ",\"emulated\":");
  sb_str(o, emu && emu[0] ? emu : NULL);
  sb_raw(o, "}");
  free(gov);
}

static int cmd_info(const char* dir) {
  struct utsname u;
  uname(&u);
  sbuf o;
  sb_init(&o);
  sb_raw(&o, "{\"protocol\":1,\"agent\":\"native\",\"agent_version\":");
  sb_str(&o, ET_AGENT_VERSION);
  sb_raw(&o, ",\"arch\":");
  sb_str(&o, u.machine);
  sb_raw(&o, ",\"python\":null,\"runtimes\":{\"tvm-kernel\":\"1\",\"onnxruntime\":");
  char lib[PATH_MAX], ver[64];
  const char* ortv = NULL;
  if (ort_find_library(NULL, dir, lib, sizeof lib) == 0) ortv = ort_library_version(lib, ver, sizeof ver);
  sb_str(&o, ortv);
  sb_raw(&o, ",\"tflite\":null,\"tvm\":null},\"fingerprint\":");
  write_fingerprint(&o);
  sb_printf(&o, ",\"nproc\":%d,\"clock\":\"CLOCK_MONOTONIC\"}", cpu_count());
  if (o.oom) return 1;
  puts(o.p);
  sb_free(&o);
  return 0;
}

/* ------------------------------------------------------------------ run */

typedef struct {
  char jobdir[PATH_MAX];
  char agent_dir[PATH_MAX];
  char reason[ERRLEN];
  int status_ok;
  double load_ms;
  long long warmup_iters;
  int64_t* samples;
  size_t n_samples;
  int n_sets, n_in, n_out;
  char (*sha_before)[65];
  char (*sha_after)[65];
  int have_before, have_after;
  int outputs_written; /* sets whose outputs were written */
  int rep_written;
  sbuf versions;
  sbuf details;
} run_state;

static void resolve(const char* jobdir, const char* p, char* out, size_t outlen) {
  if (p[0] == '/') snprintf(out, outlen, "%s", p);
  else snprintf(out, outlen, "%s/%s", jobdir, p);
}

static void device_state(sbuf* o) {
  sb_raw(o, "{\"freq_khz\":");
  cpu_freqs(o, "scaling_cur_freq", "null");
  /* hottest CPU/SoC zone; any zone when none is labelled */
  long long best = LLONG_MIN, any = LLONG_MIN;
  DIR* d = opendir("/sys/class/thermal");
  if (d) {
    struct dirent* e;
    while ((e = readdir(d))) {
      if (strncmp(e->d_name, "thermal_zone", 12)) continue;
      char path[PATH_MAX];
      snprintf(path, sizeof path, "/sys/class/thermal/%s/temp", e->d_name);
      long long t = read_ll(path);
      if (t < 0 || t > 200000) continue; /* not readable or not a plausible milli-Celsius */
      snprintf(path, sizeof path, "/sys/class/thermal/%s/type", e->d_name);
      char* type = read_text(path, 256);
      int cpu = type && (strstr(type, "cpu") || strstr(type, "CPU") || strstr(type, "soc") ||
                         strstr(type, "x86_pkg") || strstr(type, "tsens"));
      free(type);
      if (cpu && t > best) best = t;
      if (t > any) any = t;
    }
    closedir(d);
  }
  long long temp = best != LLONG_MIN ? best : any;
  if (temp != LLONG_MIN) sb_printf(o, ",\"temp_mc\":%lld}", temp);
  else sb_raw(o, ",\"temp_mc\":null}");
}

static int write_result(run_state* r) {
  sbuf o;
  sb_init(&o);
  sb_printf(&o, "{\"protocol\":1,\"status\":\"%s\",\"reason\":", r->status_ok ? "ok" : "error");
  sb_str(&o, r->status_ok ? "" : r->reason);
  sb_raw(&o, ",\"agent\":\"native\",\"agent_version\":");
  sb_str(&o, ET_AGENT_VERSION);
  sb_raw(&o, ",\"clock\":\"CLOCK_MONOTONIC\",\"load_ms\":");
  sb_double(&o, r->load_ms);
  sb_printf(&o, ",\"warmup_iters\":%lld,\"samples_ns\":[", r->warmup_iters);
  for (size_t i = 0; i < r->n_samples; i++) sb_printf(&o, "%s%lld", i ? "," : "", (long long)r->samples[i]);
  sb_raw(&o, "],\"outputs\":[");
  for (int i = 0; i < r->outputs_written; i++) {
    sb_raw(&o, i ? ",[" : "[");
    for (int k = 0; k < r->n_out; k++) sb_printf(&o, "%s\"out_%d_%d.npy\"", k ? "," : "", i, k);
    sb_raw(&o, "]");
  }
  sb_raw(&o, "],\"repeat_outputs\":[");
  for (int k = 0; r->rep_written && k < r->n_out; k++) sb_printf(&o, "%s\"rep_%d.npy\"", k ? "," : "", k);
  sb_raw(&o, "],\"input_sha256_before\":[");
  for (int i = 0; r->have_before && i < r->n_sets * r->n_in; i++) sb_printf(&o, "%s\"%s\"", i ? "," : "", r->sha_before[i]);
  sb_raw(&o, "],\"input_sha256_after\":[");
  for (int i = 0; r->have_after && i < r->n_sets * r->n_in; i++) sb_printf(&o, "%s\"%s\"", i ? "," : "", r->sha_after[i]);
  sb_raw(&o, "],\"device_state\":");
  device_state(&o);
  sb_raw(&o, ",\"runtime_versions\":{");
  if (r->versions.p) sb_raw(&o, r->versions.p);
  sb_raw(&o, "},\"backend_info\":{");
  if (r->details.p) sb_raw(&o, r->details.p);
  sb_raw(&o, "}}\n");
  if (o.oom) {
    sb_free(&o);
    return -1;
  }
  char tmp[PATH_MAX + 32], fin[PATH_MAX + 32];
  snprintf(tmp, sizeof tmp, "%s/result.json.tmp", r->jobdir);
  snprintf(fin, sizeof fin, "%s/result.json", r->jobdir);
  FILE* f = fopen(tmp, "wb");
  int ok = f && fwrite(o.p, 1, o.len, f) == o.len;
  if (f) {
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
  }
  sb_free(&o);
  if (!ok || rename(tmp, fin) != 0) {
    fprintf(stderr, "edgetune-agent: cannot write %s: %s\n", fin, strerror(errno));
    return -1;
  }
  return 0;
}

static int fail(run_state* r, const char* fmt, const char* detail) {
  snprintf(r->reason, sizeof r->reason, fmt, detail ? detail : "");
  r->status_ok = 0;
  return -1;
}

static int hash_inputs(et_tensor** sets, run_state* r, char (*out)[65]) {
  for (int i = 0; i < r->n_sets; i++)
    for (int k = 0; k < r->n_in; k++) sha256_hex(sets[i][k].data, sets[i][k].nbytes, out[i * r->n_in + k]);
  return 0;
}

static int run_job(run_state* r) {
  char err[ERRLEN], path[PATH_MAX * 2];
  snprintf(path, sizeof path, "%s/request.json", r->jobdir);
  char* text = read_text(path, 64u << 20);
  if (!text) return fail(r, "cannot read request.json: %s", strerror(errno));
  jval* req = json_parse(text, err, sizeof err);
  free(text);
  if (!req || req->type != J_OBJ) {
    json_free(req);
    return fail(r, "bad request.json: %s", req ? "not an object" : err);
  }
  int rc = -1;
  backend* be = NULL;
  et_tensor** sets = NULL;
  et_tensor* outs = NULL;
  const char** in_names = NULL;
  const char** out_names = NULL;
  int loaded = 0;

  double proto;
  if (json_num(json_get(req, "protocol"), &proto) || proto != 1) {
    fail(r, "unsupported protocol (this agent speaks 1)%s", "");
    goto done;
  }
  const char* bname = json_str(json_get(req, "backend"));
  if (!bname) { fail(r, "request has no backend%s", ""); goto done; }
  if (!strcmp(bname, "tvm-kernel")) be = backend_tvm_kernel();
  else if (!strcmp(bname, "ort")) be = backend_ort();
  else { fail(r, "backend not supported by the native agent: %s", bname); goto done; }

  /* 1. artifact sha256 */
  const char* art = json_str(json_get(req, "artifact"));
  const char* want = json_str(json_get(req, "artifact_sha256"));
  if (!art || !want) { fail(r, "request needs artifact and artifact_sha256%s", ""); goto done; }
  char artifact[PATH_MAX * 2], got[65], want_lc[65];
  resolve(r->jobdir, art, artifact, sizeof artifact);
  if (sha256_file_hex(artifact, got)) { fail(r, "cannot read artifact: %s", strerror(errno)); goto done; }
  snprintf(want_lc, sizeof want_lc, "%s", want);
  for (char* c = want_lc; *c; c++) *c = (char)tolower((unsigned char)*c);
  if (strcmp(got, want_lc)) { fail(r, "artifact sha256 mismatch%s", ""); goto done; }

  /* shapes of the request */
  const jval* jin = json_get(req, "inputs");
  const jval* jnames = json_get(req, "input_names");
  const jval* jout = json_get(req, "outputs");
  if (!jin || jin->type != J_ARR || jin->n == 0) { fail(r, "request has no input sets%s", ""); goto done; }
  if (!jout || jout->type != J_ARR || jout->n == 0) { fail(r, "request has no outputs%s", ""); goto done; }
  r->n_sets = (int)jin->n;
  r->n_in = jin->items[0]->type == J_ARR ? (int)jin->items[0]->n : -1;
  r->n_out = (int)jout->n;
  if (r->n_in < 0) { fail(r, "inputs must be a list of lists of .npy paths%s", ""); goto done; }
  for (int i = 0; i < r->n_sets; i++)
    if (jin->items[i]->type != J_ARR || (int)jin->items[i]->n != r->n_in) {
      fail(r, "every input set must have the same number of arrays%s", "");
      goto done;
    }
  if (jnames && (jnames->type != J_ARR || (int)jnames->n != r->n_in)) {
    fail(r, "input_names does not match the number of inputs per set%s", "");
    goto done;
  }
  in_names = (const char**)calloc((size_t)r->n_in + 1, sizeof(char*));
  out_names = (const char**)calloc((size_t)r->n_out + 1, sizeof(char*));
  outs = (et_tensor*)calloc((size_t)r->n_out + 1, sizeof(et_tensor));
  sets = (et_tensor**)calloc((size_t)r->n_sets, sizeof(et_tensor*));
  r->sha_before = calloc((size_t)(r->n_sets * r->n_in) + 1, 65);
  r->sha_after = calloc((size_t)(r->n_sets * r->n_in) + 1, 65);
  if (!in_names || !out_names || !outs || !sets || !r->sha_before || !r->sha_after) {
    fail(r, "out of memory%s", "");
    goto done;
  }
  for (int k = 0; k < r->n_in; k++) in_names[k] = jnames ? json_str(jnames->items[k]) : NULL;
  for (int k = 0; k < r->n_out; k++) {
    const jval* o = jout->items[k];
    out_names[k] = json_str(json_get(o, "name"));
    et_dtype dt = dtype_from_name(json_str(json_get(o, "dtype")));
    const jval* sh = json_get(o, "shape");
    int64_t shape[ET_MAX_NDIM];
    if (dt == DT_INVALID || !sh || sh->type != J_ARR || sh->n > ET_MAX_NDIM) {
      fail(r, "output %s needs a supported dtype and a shape", out_names[k] ? out_names[k] : "?");
      goto done;
    }
    for (size_t d = 0; d < sh->n; d++) {
      double v;
      if (json_num(sh->items[d], &v) || v < 0 || v != floor(v)) {
        fail(r, "output %s has a bad shape", out_names[k] ? out_names[k] : "?");
        goto done;
      }
      shape[d] = (int64_t)v;
    }
    if (tensor_alloc(&outs[k], dt, (int)sh->n, shape)) { fail(r, "cannot allocate output%s", ""); goto done; }
  }
  double ts = 0;
  json_num(json_get(req, "timing_set"), &ts);
  int timing_set = (int)ts;
  if (timing_set < 0 || timing_set >= r->n_sets) { fail(r, "timing_set out of range%s", ""); goto done; }

  /* 2. load the backend */
  const jval* params = json_get(req, "params");
  backend_config cfg = {artifact, got, params, in_names, r->n_in, out_names, r->n_out, r->agent_dir};
  int64_t t0 = now_ns();
  int lrc = be->load(be, &cfg, err, sizeof err);
  r->load_ms = (double)(now_ns() - t0) / 1e6;
  loaded = 1;
  if (lrc) { fail(r, "load failed: %s", err); goto done; }

  /* 3. inputs and their hashes */
  for (int i = 0; i < r->n_sets; i++) {
    sets[i] = (et_tensor*)calloc((size_t)r->n_in + 1, sizeof(et_tensor));
    if (!sets[i]) { fail(r, "out of memory%s", ""); goto done; }
    for (int k = 0; k < r->n_in; k++) {
      const char* p = json_str(jin->items[i]->items[k]);
      if (!p) { fail(r, "input paths must be strings%s", ""); goto done; }
      char ipath[PATH_MAX * 2];
      resolve(r->jobdir, p, ipath, sizeof ipath);
      if (npy_read(ipath, &sets[i][k], err, sizeof err)) { fail(r, "%s", err); goto done; }
    }
  }
  hash_inputs(sets, r, r->sha_before);
  r->have_before = 1;

  /* 4. every input set once, outputs poisoned before each run */
  for (int i = 0; i < r->n_sets; i++) {
    for (int k = 0; k < r->n_out; k++) tensor_poison(&outs[k]);
    if (be->bind(be, sets[i], outs, err, sizeof err) || be->run(be, err, sizeof err)) {
      char msg[ERRLEN + 64];
      snprintf(msg, sizeof msg, "input set %d: %s", i, err);
      fail(r, "run failed: %s", msg);
      goto done;
    }
    for (int k = 0; k < r->n_out; k++) {
      snprintf(path, sizeof path, "%s/out_%d_%d.npy", r->jobdir, i, k);
      if (npy_write(path, &outs[k], err, sizeof err)) { fail(r, "%s", err); goto done; }
    }
    r->outputs_written = i + 1;
  }

  /* 5. the timing set again, for the host's determinism check */
  for (int k = 0; k < r->n_out; k++) tensor_poison(&outs[k]);
  if (be->bind(be, sets[timing_set], outs, err, sizeof err) || be->run(be, err, sizeof err)) {
    fail(r, "repeat run failed: %s", err);
    goto done;
  }
  for (int k = 0; k < r->n_out; k++) {
    snprintf(path, sizeof path, "%s/rep_%d.npy", r->jobdir, k);
    if (npy_write(path, &outs[k], err, sizeof err)) { fail(r, "%s", err); goto done; }
  }
  r->rep_written = 1;

  /* 6. warm up, estimate, time one iteration at a time */
  double warmup_ms = 0, budget_ms = 0, min_iters = 1, max_iters = 100000;
  json_num(json_get(req, "warmup_ms"), &warmup_ms);
  json_num(json_get(req, "budget_ms"), &budget_ms);
  json_num(json_get(req, "min_iters"), &min_iters);
  json_num(json_get(req, "max_iters"), &max_iters);
  if (min_iters < 1) min_iters = 1;
  if (max_iters < min_iters) max_iters = min_iters;
  int64_t w0 = now_ns(), w_el;
  long long wi = 0;
  do {
    if (be->run(be, err, sizeof err)) { fail(r, "warm-up run failed: %s", err); goto done; }
    wi++;
    w_el = now_ns() - w0;
  } while ((double)w_el < warmup_ms * 1e6);
  r->warmup_iters = wi;
  double est = (double)w_el / (double)wi;
  if (est < 1) est = 1;
  double n = ceil(budget_ms * 1e6 / est);
  if (n < min_iters) n = min_iters;
  if (n > max_iters) n = max_iters;
  r->samples = (int64_t*)malloc((size_t)n * sizeof(int64_t));
  if (!r->samples) { fail(r, "out of memory%s", ""); goto done; }
  for (size_t i = 0; i < (size_t)n; i++) {
    int64_t a = now_ns();
    int brc = be->run(be, err, sizeof err);
    int64_t b = now_ns();
    if (brc) { fail(r, "timed run failed: %s", err); goto done; }
    r->samples[r->n_samples++] = b - a;
  }

  /* 7. inputs unchanged? (the host compares) */
  hash_inputs(sets, r, r->sha_after);
  r->have_after = 1;
  r->status_ok = 1;
  rc = 0;

done:
  if (be && loaded) {
    if (be->versions) be->versions(be, &r->versions);
    if (be->details) be->details(be, &r->details);
    be->unload(be);
  }
  for (int i = 0; sets && i < r->n_sets; i++) {
    for (int k = 0; sets[i] && k < r->n_in; k++) tensor_free(&sets[i][k]);
    free(sets[i]);
  }
  free(sets);
  for (int k = 0; outs && k < r->n_out; k++) tensor_free(&outs[k]);
  free(outs);
  free(in_names);
  free(out_names);
  json_free(req);
  return rc;
}

static int cmd_run(const char* jobdir, const char* dir) {
  struct stat st;
  if (stat(jobdir, &st) || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "edgetune-agent: job directory %s does not exist\n", jobdir);
    return 2;
  }
  run_state r;
  memset(&r, 0, sizeof r);
  sb_init(&r.versions);
  sb_init(&r.details);
  snprintf(r.jobdir, sizeof r.jobdir, "%s", jobdir);
  snprintf(r.agent_dir, sizeof r.agent_dir, "%s", dir);
  run_job(&r);
  int wrc = write_result(&r);
  free(r.samples);
  free(r.sha_before);
  free(r.sha_after);
  sb_free(&r.versions);
  sb_free(&r.details);
  return wrc ? 1 : 0; /* a clean backend failure is still exit 0 */
}

/* run-stdio: one round trip per job. The request comes on stdin; the job dir is created, the job run,
 * then result.json and every output file are streamed to stdout as a bundle
 *   "EDGETUNE-BUNDLE 1\n" { "NAME SIZE\n" BYTES }* "END\n"
 * and the job dir is removed. */
static int send_file(const char* dirpath, const char* name) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dirpath, name);
  FILE* f = fopen(path, "rb");
  if (!f) return -1;
  struct stat st;
  if (fstat(fileno(f), &st)) { fclose(f); return -1; }
  printf("%s %lld\n", name, (long long)st.st_size);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
  fclose(f);
  return 0;
}

static int cmd_run_stdio(const char* jobdir, const char* dir) {
  if (mkdir(jobdir, 0755) && errno != EEXIST) {
    fprintf(stderr, "edgetune-agent: cannot create %s: %s\n", jobdir, strerror(errno));
    return 2;
  }
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/request.json", jobdir);
  FILE* f = fopen(path, "wb");
  if (!f) { fprintf(stderr, "edgetune-agent: cannot write %s\n", path); return 2; }
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) fwrite(buf, 1, n, f);
  fclose(f);
  int rc = cmd_run(jobdir, dir);
  fputs("EDGETUNE-BUNDLE 1\n", stdout);
  send_file(jobdir, "result.json");
  DIR* d = opendir(jobdir);
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len > 4 && !strcmp(e->d_name + len - 4, ".npy")) send_file(jobdir, e->d_name);
  }
  if (d) closedir(d);
  fputs("END\n", stdout);
  fflush(stdout);
  d = opendir(jobdir); /* remove only what this job wrote: the dir holds nothing else */
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
    snprintf(path, sizeof path, "%s/%s", jobdir, e->d_name);
    unlink(path);
  }
  if (d) closedir(d);
  rmdir(jobdir);
  return rc;
}

int main(int argc, char** argv) {
  char dir[PATH_MAX];
  agent_dir(argv[0], dir, sizeof dir);
  if (argc >= 2 && !strcmp(argv[1], "info")) return cmd_info(dir);
  if (argc >= 3 && !strcmp(argv[1], "run")) return cmd_run(argv[2], dir);
  if (argc >= 3 && !strcmp(argv[1], "run-stdio")) return cmd_run_stdio(argv[2], dir);
  if (argc >= 2 && (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version"))) {
    puts(ET_AGENT_VERSION);
    return 0;
  }
  fprintf(stderr, "usage: %s info | run JOBDIR | run-stdio JOBDIR | version\n", argv[0]);
  return 2;
}
