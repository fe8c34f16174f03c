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
#define ET_MAX_CHECKS 32

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
  sb_raw(&o, "{\"protocol\":2,\"agent\":\"native\",\"agent_version\":");
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
  int have_before;
  int outputs_written; /* sets whose outputs were written */
  int rep_written;
  char (*sha_after_sets)[65]; /* work buffers after each input set's run */
  int have_after_sets;
  long long first_timed_iter;
  long long kept_iter[ET_MAX_CHECKS];
  int64_t kept_ns[ET_MAX_CHECKS];
  int kept_used[ET_MAX_CHECKS];
  int kept_written;
  char (*kept_sha)[65];         /* [ET_MAX_CHECKS * n_in] */
  long long late_iter;          /* -1: none */
  char late_outputs[128];
  int64_t* probe_rep;
  int64_t* probe_dist;
  int n_probe;
  char guard_violation[256];
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
  sb_printf(&o, "{\"protocol\":2,\"status\":\"%s\",\"reason\":", r->status_ok ? "ok" : "error");
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
  sb_raw(&o, "],\"input_sha256_after_sets\":[");
  for (int i = 0; r->have_after_sets && i < r->n_sets; i++) {
    sb_raw(&o, i ? ",[" : "[");
    for (int k = 0; k < r->n_in; k++) sb_printf(&o, "%s\"%s\"", k ? "," : "", r->sha_after_sets[i * r->n_in + k]);
    sb_raw(&o, "]");
  }
  sb_printf(&o, "],\"first_timed_iter\":%lld,\"timed_checks\":[", r->first_timed_iter);
  for (int c = 0, first = 1; r->kept_written && c < ET_MAX_CHECKS; c++) {
    if (!r->kept_used[c]) continue;
    sb_printf(&o, "%s{\"iter\":%lld,\"outputs\":[", first ? "" : ",", r->kept_iter[c]);
    first = 0;
    for (int k = 0; k < r->n_out; k++) sb_printf(&o, "%s\"tim_%d_%d.npy\"", k ? "," : "", c, k);
    sb_raw(&o, "],\"input_sha256_after\":[");
    for (int k = 0; k < r->n_in; k++) sb_printf(&o, "%s\"%s\"", k ? "," : "", r->kept_sha[c * r->n_in + k]);
    sb_raw(&o, "]}");
  }
  sb_raw(&o, "],\"late_change\":");
  if (r->late_iter >= 0) sb_printf(&o, "{\"iter\":%lld,\"outputs\":[%s]}", r->late_iter, r->late_outputs);
  else sb_raw(&o, "null");
  sb_raw(&o, ",\"probe\":{\"repeat_ns\":[");
  for (int i = 0; i < r->n_probe; i++) sb_printf(&o, "%s%lld", i ? "," : "", (long long)r->probe_rep[i]);
  sb_raw(&o, "],\"distinct_ns\":[");
  for (int i = 0; i < r->n_probe; i++) sb_printf(&o, "%s%lld", i ? "," : "", (long long)r->probe_dist[i]);
  sb_raw(&o, "]},\"input_check\":\"runtime buffers\",\"guard_violation\":");
  sb_str(&o, r->guard_violation);
  sb_raw(&o, ",\"device_state\":");
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

/* ---- fresh inputs (PROTOCOL.md "Fresh inputs"), identical to edgetune/agent/fresh.py ---- */
static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static void fill_set(et_tensor* work, const et_tensor* base, int n_in) {
  for (int k = 0; k < n_in; k++) memcpy(work[k].data, base[k].data, base[k].nbytes);
}

/* dst[i] = src[(i - o) mod n] for lo <= i < hi (np.roll(src, o)[lo:hi]), as at most two copies */
static void copy_rolled(char* dst, const char* src, size_t n, size_t esz, size_t o, size_t lo, size_t hi) {
  if (lo >= hi) return;
  size_t s0 = (lo + n - o % n) % n;
  size_t first = hi - lo < n - s0 ? hi - lo : n - s0;
  memcpy(dst + lo * esz, src + s0 * esz, first * esz);
  if (first < hi - lo) memcpy(dst + (lo + first) * esz, src, (hi - lo - first) * esz);
}

/* inputs of iteration t: elements [0, cut) from set a rolled by o1, [cut, n) from set b rolled by o2 */
static void fill_fresh(et_tensor* work, et_tensor** sets, int n_sets, int n_in, uint64_t seed, long long t) {
  for (int k = 0; k < n_in; k++) {
    size_t esz = dtype_size(work[k].dtype);
    size_t n = esz ? work[k].nbytes / esz : 0;
    if (!n) continue;
    uint64_t h1 = splitmix64(seed + ((uint64_t)t << 16) + (uint64_t)k);
    uint64_t h2 = splitmix64(h1), h3 = splitmix64(h2);
    int a = (int)(t % n_sets);
    int b = n_sets > 1 ? (int)((a + 1 + (h3 >> 32) % (uint64_t)(n_sets - 1)) % (uint64_t)n_sets) : a;
    size_t o1 = (size_t)(h1 % n), o2 = (size_t)(h2 % n), cut = (size_t)(h3 % (n + 1));
    copy_rolled((char*)work[k].data, (const char*)sets[a][k].data, n, esz, o1, 0, cut);
    copy_rolled((char*)work[k].data, (const char*)sets[b][k].data, n, esz, o2, cut, n);
  }
}

static uint64_t urandom64(void) {
  uint64_t v = 0;
  FILE* f = fopen("/dev/urandom", "rb");
  if (!f || fread(&v, sizeof v, 1, f) != 1) v = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32);
  if (f) fclose(f);
  return v ? v : 0x2545F4914F6CDD1Dull;
}

static uint64_t xorshift(uint64_t* s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* -1 (and the job failed) when a candidate wrote outside a buffer it was given */
static int guards_ok(run_state* r, const et_tensor* work, const et_tensor* outs) {
  for (int pass = 0; pass < 2; pass++) {
    const et_tensor* ts = pass ? work : outs;
    int n = pass ? r->n_in : r->n_out;
    for (int k = 0; k < n; k++) {
      int g = tensor_guard_check(&ts[k]);
      if (g) {
        snprintf(r->guard_violation, sizeof r->guard_violation,
                 "out-of-bounds write %s %s %d (its guard zone was overwritten)", g < 0 ? "before" : "past the end of",
                 pass ? "input" : "output", k);
        fail(r, "%s", r->guard_violation);
        return -1;
      }
    }
  }
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
  et_tensor* work = NULL;
  et_tensor* kept = NULL;
  const char** in_names = NULL;
  const char** out_names = NULL;
  int loaded = 0;

  double proto;
  if (json_num(json_get(req, "protocol"), &proto) || proto != 2) {
    fail(r, "unsupported protocol (this agent speaks 2)%s", "");
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
  if (!in_names || !out_names || !outs || !sets || !r->sha_before) {
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
    if (tensor_alloc_guarded(&outs[k], dt, (int)sh->n, shape)) { fail(r, "cannot allocate output%s", ""); goto done; }
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

  /* 3. inputs and their hashes; the candidate never sees these, only the guarded work buffers */
  for (int i = 0; i < r->n_sets; i++) {
    sets[i] = (et_tensor*)calloc((size_t)r->n_in + 1, sizeof(et_tensor));
    if (!sets[i]) { fail(r, "out of memory%s", ""); goto done; }
    for (int k = 0; k < r->n_in; k++) {
      const char* p = json_str(jin->items[i]->items[k]);
      if (!p) { fail(r, "input paths must be strings%s", ""); goto done; }
      char ipath[PATH_MAX * 2];
      resolve(r->jobdir, p, ipath, sizeof ipath);
      if (npy_read(ipath, &sets[i][k], err, sizeof err)) { fail(r, "%s", err); goto done; }
      if (i && (sets[i][k].nbytes != sets[0][k].nbytes || sets[i][k].dtype != sets[0][k].dtype)) {
        fail(r, "input sets must agree in shapes and dtypes%s", "");
        goto done;
      }
    }
  }
  hash_inputs(sets, r, r->sha_before);
  r->have_before = 1;
  work = (et_tensor*)calloc((size_t)r->n_in + 1, sizeof(et_tensor));
  r->sha_after_sets = calloc((size_t)(r->n_sets * r->n_in) + 1, 65);
  r->kept_sha = calloc((size_t)(ET_MAX_CHECKS * r->n_in) + 1, 65);
  kept = (et_tensor*)calloc((size_t)(ET_MAX_CHECKS * r->n_out) + 1, sizeof(et_tensor));
  if (!work || !r->sha_after_sets || !r->kept_sha || !kept) { fail(r, "out of memory%s", ""); goto done; }
  for (int k = 0; k < r->n_in; k++)
    if (tensor_alloc_guarded(&work[k], sets[0][k].dtype, sets[0][k].ndim, sets[0][k].shape)) {
      fail(r, "cannot allocate input%s", "");
      goto done;
    }
  if (be->bind(be, work, outs, err, sizeof err)) { fail(r, "bind failed: %s", err); goto done; }

  double fresh_seed_d = 0, checks_d = 4, fastest_d = 2, probe_d = 16;
  json_num(json_get(req, "fresh_seed"), &fresh_seed_d);
  json_num(json_get(req, "check_iters"), &checks_d);
  json_num(json_get(req, "check_fastest"), &fastest_d);
  json_num(json_get(req, "probe_pairs"), &probe_d);
  uint64_t seed = (uint64_t)fresh_seed_d;
  int n_checks = checks_d < 1 ? 1 : checks_d > ET_MAX_CHECKS / 2 ? ET_MAX_CHECKS / 2 : (int)checks_d;
  int n_fastest = fastest_d < 0 ? 0 : fastest_d > ET_MAX_CHECKS / 2 ? ET_MAX_CHECKS / 2 : (int)fastest_d;
  int n_probe = probe_d < 0 ? 0 : probe_d > 1000 ? 1000 : (int)probe_d;

  /* 4. every input set once into poisoned outputs, then set 0 again (determinism) */
  for (int i = 0; i < r->n_sets; i++) {
    fill_set(work, sets[i], r->n_in);
    for (int k = 0; k < r->n_out; k++) tensor_poison(&outs[k]);
    if (be->run(be, err, sizeof err)) {
      char msg[ERRLEN + 64];
      snprintf(msg, sizeof msg, "input set %d: %s", i, err);
      fail(r, "run failed: %s", msg);
      goto done;
    }
    if (guards_ok(r, work, outs)) goto done;
    for (int k = 0; k < r->n_in; k++) sha256_hex(work[k].data, work[k].nbytes, r->sha_after_sets[i * r->n_in + k]);
    for (int k = 0; k < r->n_out; k++) {
      snprintf(path, sizeof path, "%s/out_%d_%d.npy", r->jobdir, i, k);
      if (npy_write(path, &outs[k], err, sizeof err)) { fail(r, "%s", err); goto done; }
    }
    r->outputs_written = i + 1;
  }
  r->have_after_sets = 1;
  fill_set(work, sets[0], r->n_in);
  for (int k = 0; k < r->n_out; k++) tensor_poison(&outs[k]);
  if (be->run(be, err, sizeof err)) { fail(r, "repeat run failed: %s", err); goto done; }
  if (guards_ok(r, work, outs)) goto done;
  for (int k = 0; k < r->n_out; k++) {
    snprintf(path, sizeof path, "%s/rep_%d.npy", r->jobdir, k);
    if (npy_write(path, &outs[k], err, sizeof err)) { fail(r, "%s", err); goto done; }
  }
  r->rep_written = 1;

  /* 5. warm up on fresh inputs (iterations 0..W-1), estimate, then time one iteration at a time */
  double warmup_ms = 0, budget_ms = 0, min_iters = 1, max_iters = 100000;
  json_num(json_get(req, "warmup_ms"), &warmup_ms);
  json_num(json_get(req, "budget_ms"), &budget_ms);
  json_num(json_get(req, "min_iters"), &min_iters);
  json_num(json_get(req, "max_iters"), &max_iters);
  if (min_iters < 1) min_iters = 1;
  if (max_iters < min_iters) max_iters = min_iters;
  long long t = 0;
  int64_t spent = 0;
  do {
    fill_fresh(work, sets, r->n_sets, r->n_in, seed, t);
    for (int k = 0; k < r->n_out; k++) tensor_poison(&outs[k]);
    int64_t a = now_ns();
    if (be->run(be, err, sizeof err)) { fail(r, "warm-up run failed: %s", err); goto done; }
    spent += now_ns() - a;
    t++;
  } while ((double)spent < warmup_ms * 1e6 && (double)t < max_iters); /* bounded whatever the clock says */
  if (guards_ok(r, work, outs)) goto done;
  r->warmup_iters = t;
  r->first_timed_iter = t;
  double est = (double)spent / (double)t;
  if (est < 1) est = 1;
  double n = ceil(budget_ms * 1e6 / est);
  if (n < min_iters) n = min_iters;
  if (n > max_iters) n = max_iters;
  r->samples = (int64_t*)malloc((size_t)n * sizeof(int64_t));
  if (!r->samples) { fail(r, "out of memory%s", ""); goto done; }
  uint64_t rng = urandom64();
  for (size_t j = 0; j < (size_t)n; j++, t++) {
    fill_fresh(work, sets, r->n_sets, r->n_in, seed, t);
    for (int k = 0; k < r->n_out; k++) tensor_poison(&outs[k]);
    int64_t a = now_ns();
    int brc = be->run(be, err, sizeof err);
    int64_t b = now_ns();
    if (brc) { fail(r, "timed run failed: %s", err); goto done; }
    r->samples[r->n_samples++] = b - a;
    /* reservoir: kept or not is decided after the call returned, from the OS's randomness */
    int slots[2] = {-1, -1};
    if ((long long)j < n_checks) slots[0] = (int)j;
    else {
      uint64_t pick = xorshift(&rng) % (uint64_t)(j + 1);
      if (pick < (uint64_t)n_checks) slots[0] = (int)pick;
    }
    /* and the fastest iterations: work a candidate skipped would make an iteration fast */
    if (n_fastest) {
      int slowest = -1;
      for (int f = 0; f < n_fastest; f++) {
        int sl = n_checks + f;
        if (!r->kept_used[sl]) { slowest = sl; break; }
        if (slowest < 0 || r->kept_ns[sl] > r->kept_ns[slowest]) slowest = sl;
      }
      if (!r->kept_used[slowest] || r->samples[j] < r->kept_ns[slowest]) slots[1] = slowest;
    }
    for (int q = 0; q < 2; q++) {
      int slot = slots[q];
      if (slot < 0) continue;
      if (guards_ok(r, work, outs)) goto done;
      r->kept_iter[slot] = t;
      r->kept_ns[slot] = r->samples[j];
      r->kept_used[slot] = 1;
      for (int k = 0; k < r->n_out; k++) {
        et_tensor* kt = &kept[slot * r->n_out + k];
        if (!kt->data && tensor_alloc(kt, outs[k].dtype, outs[k].ndim, outs[k].shape)) {
          fail(r, "out of memory%s", "");
          goto done;
        }
        memcpy(kt->data, outs[k].data, outs[k].nbytes);
      }
      for (int k = 0; k < r->n_in; k++) sha256_hex(work[k].data, work[k].nbytes, r->kept_sha[slot * r->n_in + k]);
    }
  }
  if (guards_ok(r, work, outs)) goto done;

  /* 6. MLPerf TEST04-style probe: one input repeated vs distinct inputs, interleaved */
  r->probe_rep = (int64_t*)calloc((size_t)n_probe + 1, sizeof(int64_t));
  r->probe_dist = (int64_t*)calloc((size_t)n_probe + 1, sizeof(int64_t));
  if (!r->probe_rep || !r->probe_dist) { fail(r, "out of memory%s", ""); goto done; }
  long long rep_t = t++;
  { /* no more time than the timed loop's budget (the host judges TEST04 only from 8 pairs up) */
    double fit = budget_ms * 1e6 / (2.0 * est);
    if (fit < n_probe) n_probe = (int)fit;
  }
  if (n_probe) { /* the repeated input once untimed first: a cache would hold it from here on */
    fill_fresh(work, sets, r->n_sets, r->n_in, seed, rep_t);
    if (be->run(be, err, sizeof err)) { fail(r, "probe run failed: %s", err); goto done; }
  }
  for (int i = 0; i < n_probe; i++) {
    /* the order alternates within pairs, so an effect of running first or second cancels out */
    for (int q = 0; q < 2; q++) {
      int repeat = (q == 0) == (i % 2 == 0);
      fill_fresh(work, sets, r->n_sets, r->n_in, seed, repeat ? rep_t : t++);
      int64_t a = now_ns();
      if (be->run(be, err, sizeof err)) { fail(r, "probe run failed: %s", err); goto done; }
      if (repeat) r->probe_rep[i] = now_ns() - a;
      else r->probe_dist[i] = now_ns() - a;
    }
    r->n_probe = i + 1;
  }
  if (guards_ok(r, work, outs)) goto done;

  /* 7. the last call's outputs must not change after it returned (work left to a thread); last, so
   *    nothing a candidate left running can still write into buffers the agent frees */
  {
    et_tensor* snap = (et_tensor*)calloc((size_t)r->n_out + 1, sizeof(et_tensor));
    if (!snap) { fail(r, "out of memory%s", ""); goto done; }
    int ok = 1;
    for (int k = 0; k < r->n_out && ok; k++) {
      ok = !tensor_alloc(&snap[k], outs[k].dtype, outs[k].ndim, outs[k].shape);
      if (ok) memcpy(snap[k].data, outs[k].data, outs[k].nbytes);
    }
    if (ok) {
      double wait_ns = 3.0 * est > 5e7 ? 3.0 * est : 5e7;
      struct timespec ts = {(time_t)(wait_ns / 1e9), (long)fmod(wait_ns, 1e9)};
      nanosleep(&ts, NULL);
      r->late_iter = -1;
      for (int k = 0; k < r->n_out; k++)
        if (memcmp(snap[k].data, outs[k].data, outs[k].nbytes)) {
          size_t len = strlen(r->late_outputs);
          snprintf(r->late_outputs + len, sizeof r->late_outputs - len, "%s%d", len ? "," : "", k);
          r->late_iter = t - 1;
        }
    }
    for (int k = 0; k < r->n_out; k++) tensor_free(&snap[k]);
    free(snap);
    if (!ok) { fail(r, "out of memory%s", ""); goto done; }
  }

  for (int c = 0; c < ET_MAX_CHECKS; c++) {
    if (!r->kept_used[c]) continue;
    for (int d = 0; d < c; d++)
      if (r->kept_used[d] && r->kept_iter[d] == r->kept_iter[c]) r->kept_used[c] = 0; /* same iteration twice */
    if (!r->kept_used[c]) continue;
    for (int k = 0; k < r->n_out; k++) {
      snprintf(path, sizeof path, "%s/tim_%d_%d.npy", r->jobdir, c, k);
      if (npy_write(path, &kept[c * r->n_out + k], err, sizeof err)) { fail(r, "%s", err); goto done; }
    }
  }
  r->kept_written = 1;
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
  for (int k = 0; work && k < r->n_in; k++) tensor_free(&work[k]);
  free(work);
  for (int i = 0; kept && i < ET_MAX_CHECKS * r->n_out; i++) tensor_free(&kept[i]);
  free(kept);
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
  r.late_iter = -1;
  run_job(&r);
  int wrc = write_result(&r);
  free(r.samples);
  free(r.sha_before);
  free(r.sha_after_sets);
  free(r.kept_sha);
  free(r.probe_rep);
  free(r.probe_dist);
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
