/* The device fingerprint: see fingerprint.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <errno.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fingerprint.h"

char* et_read_text(const char* path, size_t max) {
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

void et_trim(char* s) {
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  size_t i = 0;
  while (isspace((unsigned char)s[i])) i++;
  if (i) memmove(s, s + i, n - i + 1);
}

/* One "key : value" line of /proc/cpuinfo (first match), or "key=value" of a .prop file. */
int et_field(const char* text, const char* key, char sep, char* out, size_t outlen) {
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
    et_trim(out);
    if (out[0] == '"' && n >= 2 && out[strlen(out) - 1] == '"') { /* os-release quoting */
      memmove(out, out + 1, strlen(out));
      out[strlen(out) - 1] = 0;
    }
    return 0;
  }
  return -1;
}

static char* android_prop(const char* key, char* out, size_t outlen) {
  static const char* files[] = {"/system/build.prop", "/vendor/build.prop", "/odm/etc/build.prop",
                                "/product/etc/build.prop"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char* t = et_read_text(files[i], 1 << 20);
    if (!t) continue;
    int rc = et_field(t, key, '=', out, outlen);
    free(t);
    if (rc == 0 && out[0]) return out;
  }
  return NULL;
}

long long et_read_ll(const char* path) {
  char* t = et_read_text(path, 4096);
  if (!t) return -1;
  char* end;
  long long v = strtoll(t, &end, 10);
  int ok = end != t;
  free(t);
  return ok ? v : -1;
}

static int all_digits(const char* s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!isdigit((unsigned char)*s)) return 0;
  return 1;
}

static int cmp_str(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

/* The Python agent's reading of /proc/cpuinfo: the first "model name", "cpu model" or
 * "processor" line whose value is not a number, else "ARM CPU part " + the distinct CPU parts. */
static void python_cpu_model(const char* cpuinfo, char* model, size_t mlen, char* hw, size_t hlen) {
  char* parts[64];
  int np = 0;
  model[0] = hw[0] = 0;
  const char* line = cpuinfo;
  while (line && *line) {
    const char* nl = strchr(line, '\n');
    size_t n = nl ? (size_t)(nl - line) : strlen(line);
    char buf[512];
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, line, n);
    buf[n] = 0;
    char* colon = strchr(buf, ':');
    char key[128] = "", val[384] = "";
    if (colon) {
      *colon = 0;
      snprintf(key, sizeof key, "%s", buf);
      snprintf(val, sizeof val, "%s", colon + 1);
    } else {
      snprintf(key, sizeof key, "%s", buf);
    }
    et_trim(key);
    et_trim(val);
    for (char* k = key; *k; k++) *k = (char)tolower((unsigned char)*k);
    if ((!strcmp(key, "model name") || !strcmp(key, "cpu model") || !strcmp(key, "processor")) && !model[0] &&
        val[0] && !all_digits(val)) {
      snprintf(model, mlen, "%s", val);
    } else if (!strcmp(key, "hardware")) {
      snprintf(hw, hlen, "%s", val);
    } else if (!strcmp(key, "cpu part") && np < 64) {
      int seen = 0;
      for (int i = 0; i < np; i++) seen |= !strcmp(parts[i], val);
      if (!seen) parts[np++] = strdup(val);
    }
    line = nl ? nl + 1 : NULL;
  }
  if (!model[0] && np) {
    qsort(parts, (size_t)np, sizeof parts[0], cmp_str);
    size_t used = (size_t)snprintf(model, mlen, "ARM CPU part ");
    for (int i = 0; i < np && used < mlen; i++)
      used += (size_t)snprintf(model + used, mlen - used, "%s%s", i ? "/" : "", parts[i]);
  }
  for (int i = 0; i < np; i++) free(parts[i]);
}

void et_fingerprint_collect(et_fingerprint* fp) {
  memset(fp, 0, sizeof *fp);
  struct utsname u;
  uname(&u);
  snprintf(fp->arch, sizeof fp->arch, "%s", u.machine);
  snprintf(fp->kernel, sizeof fp->kernel, "%s", u.release);
  char* cpuinfo = et_read_text("/proc/cpuinfo", 1 << 20);
  char v[256];
  if (cpuinfo) {
    if (et_field(cpuinfo, "model name", ':', v, sizeof v) == 0) snprintf(fp->cpu_model, sizeof fp->cpu_model, "%s", v);
    else if (et_field(cpuinfo, "Processor", ':', v, sizeof v) == 0) snprintf(fp->cpu_model, sizeof fp->cpu_model, "%s", v);
    else if (et_field(cpuinfo, "cpu model", ':', v, sizeof v) == 0) snprintf(fp->cpu_model, sizeof fp->cpu_model, "%s", v);
    if (!fp->cpu_model[0] || !strcmp(fp->cpu_model, "AArch64 Processor")) {
      char impl[64], part[64];
      if (et_field(cpuinfo, "CPU implementer", ':', impl, sizeof impl) == 0 &&
          et_field(cpuinfo, "CPU part", ':', part, sizeof part) == 0)
        snprintf(fp->cpu_model, sizeof fp->cpu_model, "implementer %s part %s", impl, part);
    }
    if (et_field(cpuinfo, "Hardware", ':', v, sizeof v) == 0) snprintf(fp->soc, sizeof fp->soc, "%s", v);
    python_cpu_model(cpuinfo, fp->cpu_model_py, sizeof fp->cpu_model_py, fp->soc_py, sizeof fp->soc_py);
  }
  if (!fp->soc[0] && (android_prop("ro.soc.model", v, sizeof v) || android_prop("ro.board.platform", v, sizeof v)))
    snprintf(fp->soc, sizeof fp->soc, "%s", v);
  free(cpuinfo);
  if (!fp->cpu_model[0]) snprintf(fp->cpu_model, sizeof fp->cpu_model, "%s", u.machine);
  if (!fp->cpu_model_py[0]) snprintf(fp->cpu_model_py, sizeof fp->cpu_model_py, "%s", u.machine);

  char* osr = et_read_text("/etc/os-release", 1 << 16);
  if (osr && et_field(osr, "PRETTY_NAME", '=', v, sizeof v) == 0) snprintf(fp->os, sizeof fp->os, "%s", v);
  free(osr);
  if (!fp->os[0]) {
    char rel[64], id[128];
    if (android_prop("ro.build.version.release", rel, sizeof rel)) {
      if (android_prop("ro.build.fingerprint", v, sizeof v)) snprintf(fp->os, sizeof fp->os, "Android %s (%s)", rel, v);
      else if (android_prop("ro.build.id", id, sizeof id)) snprintf(fp->os, sizeof fp->os, "Android %s (%s)", rel, id);
      else snprintf(fp->os, sizeof fp->os, "Android %s", rel);
    }
  }
  if (!fp->os[0]) snprintf(fp->os, sizeof fp->os, "%s", u.sysname);

  char* gov = et_read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", 256);
  if (gov) {
    et_trim(gov);
    snprintf(fp->governor, sizeof fp->governor, "%s", gov);
    free(gov);
  }
  fp->cores = (int)sysconf(_SC_NPROCESSORS_CONF);
  fp->cores_online = (int)sysconf(_SC_NPROCESSORS_ONLN);
  for (int i = 0; i < fp->cores && fp->n_freq < ET_FP_MAX_CPUS; i++) {
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cpufreq/cpuinfo_max_freq", i);
    long long f = et_read_ll(path);
    if (f >= 0) fp->max_freq_khz[fp->n_freq++] = f;
  }
  const char* emu = getenv("EDGETUNE_EMULATED");
  if (emu) snprintf(fp->emulated, sizeof fp->emulated, "%s", emu);
}

void et_fingerprint_json(sbuf* o, const et_fingerprint* fp) {
  sb_raw(o, "{\"cpu_model\":");
  sb_str(o, fp->cpu_model);
  sb_raw(o, ",\"soc\":");
  sb_str(o, fp->soc[0] ? fp->soc : NULL);
  sb_printf(o, ",\"cores\":%d,\"max_freq_khz\":[", fp->cores);
  for (int i = 0; i < fp->n_freq; i++) sb_printf(o, "%s%lld", i ? "," : "", fp->max_freq_khz[i]);
  sb_raw(o, "],\"kernel\":");
  sb_str(o, fp->kernel);
  sb_raw(o, ",\"os\":");
  sb_str(o, fp->os);
  sb_raw(o, ",\"governor\":");
  sb_str(o, fp->governor[0] ? fp->governor : NULL);
  /* a board whose binaries run under emulation says so: its timings are never compared */
  sb_raw(o, ",\"emulated\":");
  sb_str(o, fp->emulated[0] ? fp->emulated : NULL);
  if (fp->gpus) { /* only a device with GPUs has the key: a CPU device's fingerprint stays what it was */
    sb_raw(o, ",\"gpus\":");
    sb_raw(o, fp->gpus);
  }
  sb_raw(o, "}");
}

/* ------------------------------------------------------------------ GPUs */

/* stdout of argv (found on PATH when argv[0] has no slash), at most cap-1 bytes; NULL if it did not run.
 * fork + execvp (not posix_spawn: Android has it from API 28 only, and the loader shares this file) */
static char* run_capture(char* const argv[], size_t cap) {
  int fds[2];
  if (pipe(fds)) return NULL;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return NULL;
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (dup2(fds[1], 1) < 0 || (devnull >= 0 && dup2(devnull, 2) < 0)) _exit(127);
    close(fds[0]);
    close(fds[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  char* out = (char*)malloc(cap);
  size_t len = 0;
  ssize_t got;
  while (out && len + 1 < cap && (got = read(fds[0], out + len, cap - 1 - len)) != 0) {
    if (got < 0) break;
    len += (size_t)got;
  }
  close(fds[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (out) out[len] = 0;
  return out;
}

/* "13.0" from a CUDA version call (cuDriverGetVersion, cudaRuntimeGetVersion), or "" */
static void cuda_version(const char* lib, const char* fn, char* out, size_t outlen) {
  out[0] = 0;
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) return;
  int (*get)(int*) = (int (*)(int*))dlsym(h, fn);
  int v = 0;
  if (get && get(&v) == 0 && v > 0) snprintf(out, outlen, "%d.%d", v / 1000, (v % 1000) / 10);
}

/* the CUDA runtime's soname as Python's ctypes.util.find_library("cudart") finds it first (the first
 * `ldconfig -p` entry of this ABI), or "" */
static void cudart_soname(char* out, size_t outlen) {
  out[0] = 0;
#if defined(__x86_64__)
  const char* abi = "(libc6,x86-64";
#elif defined(__aarch64__)
  const char* abi = "(libc6,AArch64";
#else
  const char* abi = NULL;
#endif
  if (!abi) return;
  static const char* ldconfigs[] = {"/sbin/ldconfig", "/usr/sbin/ldconfig"};
  for (size_t i = 0; i < 2 && !out[0]; i++) {
    char* argv[] = {(char*)ldconfigs[i], (char*)"-p", NULL};
    char* text = run_capture(argv, 1 << 22);
    for (char* line = text; line && *line && !out[0];) {
      char* nl = strchr(line, '\n');
      if (nl) *nl = 0;
      char* p = line;
      while (*p == ' ' || *p == '\t') p++;
      char name[256];
      if (!strncmp(p, "libcudart.", 10) && sscanf(p, "%255s", name) == 1 && strstr(p, abi)) snprintf(out, outlen, "%s", name);
      line = nl ? nl + 1 : NULL;
    }
    free(text);
  }
}

/* a number nvidia-smi printed (nounits) as JSON, or null for [N/A], [Not Supported], ... */
static void json_num_or_null(sbuf* o, const char* t) {
  char* end;
  double v = strtod(t, &end);
  if (end == t || *end) {
    sb_raw(o, "null");
    return;
  }
  if (v == (double)(long long)v) sb_printf(o, "%lld", (long long)v);
  else sb_printf(o, "%.17g", v);
}

void et_fingerprint_gpus(et_fingerprint* fp) {
  fp->gpus = NULL;
  char* argv[] = {(char*)"nvidia-smi",
                  (char*)"--query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.mem,pci.bus_id",
                  (char*)"--format=csv,noheader,nounits", NULL};
  char* text = run_capture(argv, 1 << 16);
  if (!text) return;
  char drv[32], rt[32], soname[256];
  cuda_version("libcuda.so.1", "cuDriverGetVersion", drv, sizeof drv);
  cudart_soname(soname, sizeof soname);
  rt[0] = 0;
  if (soname[0]) cuda_version(soname, "cudaRuntimeGetVersion", rt, sizeof rt);
  sbuf o;
  sb_init(&o);
  int n = 0;
  for (char* line = text; line && *line;) {
    char* nl = strchr(line, '\n');
    if (nl) *nl = 0;
    char* f[8];
    int nf = 0;
    for (char* p = line; nf < 8;) { /* split on ',' and strip */
      char* c = strchr(p, ',');
      if (c) *c = 0;
      et_trim(p);
      while (*p == ' ' || *p == '\t') p++;
      f[nf++] = p;
      if (!c) break;
      p = c + 1;
    }
    if (nf == 7 && f[0][0]) {
      int major, minor;
      char sm[32] = "";
      char tail;
      if (sscanf(f[1], "%d.%d%c", &major, &minor, &tail) == 2 && major >= 0 && minor >= 0)
        snprintf(sm, sizeof sm, "sm_%d%d", major, minor);
      sb_raw(&o, n++ ? "," : "[");
      sb_raw(&o, "{\"name\":");
      sb_str(&o, f[0]);
      sb_raw(&o, ",\"sm\":");
      sb_str(&o, sm[0] ? sm : NULL);
      sb_raw(&o, ",\"driver\":");
      sb_str(&o, f[2]);
      sb_raw(&o, ",\"memory_mib\":");
      json_num_or_null(&o, f[3]);
      sb_raw(&o, ",\"max_sm_clock_mhz\":");
      json_num_or_null(&o, f[4]);
      sb_raw(&o, ",\"max_mem_clock_mhz\":");
      json_num_or_null(&o, f[5]);
      sb_raw(&o, ",\"pci_bus\":");
      sb_str(&o, f[6]);
      sb_raw(&o, ",\"cuda_driver\":");
      sb_str(&o, drv[0] ? drv : NULL);
      sb_raw(&o, ",\"cuda_runtime\":");
      sb_str(&o, rt[0] ? rt : NULL);
      sb_raw(&o, "}");
    }
    line = nl ? nl + 1 : NULL;
  }
  free(text);
  if (n) {
    sb_raw(&o, "]");
    fp->gpus = o.p ? strdup(o.p) : NULL;
  }
  sb_free(&o);
}
