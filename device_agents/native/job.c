/* The worker's job, around its timed run: the request's bounds, result.json, fresh inputs (PROTOCOL.md
 * "Fresh inputs"), the guard checks, and `edgetune-agent run JOBDIR`. */
#include "agent_internal.h"

/* the process running the job: a process a candidate forked that returns into the agent's code
 * stops before it writes a file of the job (the job's own process goes on) */
static pid_t g_worker_pid;

static void only_the_worker(void) {
  if (g_worker_pid && getpid() != g_worker_pid) _exit(0);
}

int job_save_npy(const char* path, const et_tensor* t, char* err, size_t errlen) {
  only_the_worker();
  return npy_write(path, t, err, errlen);
}
/* 0, or -1 with err set when a bound is not a positive number (an integer where it counts things) or null */
int job_parse_limits(const jval* req, limits_t* lim, char* err, size_t errlen) {
  memset(lim, 0, sizeof *lim);
  const jval* l = json_get(req, "limits");
  if (l && l->type != J_NULL && l->type != J_OBJ) {
    snprintf(err, errlen, "limits must be an object");
    return -1;
  }
  static const char* names[] = {"memory_mb", "max_procs", "timeout_s", "max_bundle_bytes"};
  for (int i = 0; i < 4; i++) {
    const jval* v = i == 3 ? json_get(req, names[i]) : json_get(l, names[i]);
    if (!v || v->type == J_NULL) continue;
    double d = v->num;
    if (v->type != J_NUM || !(d > 0) || d > 9e15 || (i != 2 && d != floor(d))) {
      snprintf(err, errlen, "%s%s must be a positive %s or null", i == 3 ? "" : "limits.", names[i],
               i == 2 ? "number" : "integer");
      return -1;
    }
    if (i == 0) lim->memory_mb = (long long)d;
    else if (i == 1) lim->max_procs = (long long)d;
    else if (i == 2) lim->timeout_s = d;
    else lim->max_bundle = (long long)d;
  }
  return 0;
}
void job_path(const char* jobdir, const char* p, char* out, size_t outlen) {
  if (p[0] == '/') snprintf(out, outlen, "%s", p);
  else snprintf(out, outlen, "%s/%s", jobdir, p);
}

static void cpu_freqs(sbuf* out, const char* file, const char* when_none) {
  int n = (int)sysconf(_SC_NPROCESSORS_CONF), any = 0;
  sbuf tmp;
  sb_init(&tmp);
  sb_raw(&tmp, "[");
  for (int i = 0; i < n; i++) {
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cpufreq/%s", i, file);
    long long v = et_read_ll(path);
    if (v < 0) continue;
    sb_printf(&tmp, "%s%lld", any ? "," : "", v);
    any = 1;
  }
  sb_raw(&tmp, "]");
  sb_raw(out, any ? tmp.p : when_none);
  sb_free(&tmp);
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
      long long t = et_read_ll(path);
      if (t < 0 || t > 200000) continue; /* not readable or not a plausible milli-Celsius */
      snprintf(path, sizeof path, "/sys/class/thermal/%s/type", e->d_name);
      char* type = et_read_text(path, 256);
      int cpu = type && (strstr(type, "cpu") || strstr(type, "CPU") || strstr(type, "soc") ||
                         strstr(type, "x86_pkg") || strstr(type, "tsens"));
      free(type);
      if (cpu && t > best) best = t;
      if (t > any) any = t;
    }
    closedir(d);
  }
  long long temp = best != LLONG_MIN ? best : any;
  if (temp != LLONG_MIN) sb_printf(o, ",\"temp_mc\":%lld", temp);
  else sb_raw(o, ",\"temp_mc\":null");
  /* the 1-minute load average and the CPUs it is shared by: the host scales job time limits by it */
  char* load = et_read_text("/proc/loadavg", 256);
  double load1 = -1.0;
  if (load && sscanf(load, "%lf", &load1) != 1) load1 = -1.0;
  free(load);
  if (load1 >= 0.0) sb_printf(o, ",\"load1\":%.2f,\"cpus\":%d}", load1, cpu_count());
  else sb_printf(o, ",\"load1\":null,\"cpus\":%d}", cpu_count());
}

static int write_result(run_state* r) {
  sbuf o;
  sb_init(&o);
  sb_printf(&o, "{\"protocol\":%d,\"status\":\"%s\",\"reason\":", PROTOCOL, r->status_ok ? "ok" : "error");
  sb_str(&o, r->status_ok ? "" : r->reason);
  if (!r->status_ok && r->limit) sb_printf(&o, ",\"limit\":\"%s\"", r->limit);
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
  if (r->judged) {
    sb_raw(&o, "],\"fault\":");
    if (r->fault_code[0]) {
      sb_raw(&o, "{\"code\":");
      sb_str(&o, r->fault_code);
      sb_raw(&o, ",\"detail\":");
      sb_str(&o, r->fault_detail);
      sb_raw(&o, "}");
    } else {
      sb_raw(&o, "null");
    }
    sb_raw(&o, ",\"late_change\":");
  } else {
    sb_raw(&o, "],\"late_change\":");
  }
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
  only_the_worker();
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

int job_fail(run_state* r, const char* fmt, const char* detail) {
  snprintf(r->reason, sizeof r->reason, fmt, detail ? detail : "");
  r->status_ok = 0;
  return -1;
}

int job_hash_inputs(et_tensor** sets, run_state* r, char (*out)[65]) {
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

void job_fill_set(et_tensor* work, const et_tensor* base, int n_in) {
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
void job_fill_fresh(et_tensor* work, et_tensor** sets, int n_sets, int n_in, uint64_t seed, long long t) {
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

uint64_t job_urandom64(void) {
  uint64_t v = 0;
  FILE* f = fopen("/dev/urandom", "rb");
  if (!f || fread(&v, sizeof v, 1, f) != 1) v = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 32);
  if (f) fclose(f);
  return v ? v : 0x2545F4914F6CDD1Dull;
}

uint64_t job_xorshift(uint64_t* s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* -1 (and the job failed) when a candidate wrote outside a buffer it was given */
int job_guards_ok(run_state* r, backend* be, const et_tensor* work, const et_tensor* outs) {
  char err[ERRLEN];
  const backend_hooks* hk = backend_hooks_of(be);
  if (hk && hk->check && hk->check(be, err, sizeof err)) { /* a fault the backend saw (judge: its kernel child) */
    job_fail(r, "%s", err);
    return -1;
  }
  for (int pass = 0; pass < 2; pass++) {
    const et_tensor* ts = pass ? work : outs;
    int n = pass ? r->n_in : r->n_out;
    for (int k = 0; k < n; k++) {
      int g = tensor_guard_check(&ts[k]);
      if (g) {
        snprintf(r->guard_violation, sizeof r->guard_violation,
                 "out-of-bounds write %s %s %d (its guard zone was overwritten)", g < 0 ? "before" : "past the end of",
                 pass ? "input" : "output", k);
        job_fail(r, "%s", r->guard_violation);
        return -1;
      }
    }
  }
  return 0;
}

/* a run's time: the backend's own measurement where it has one (timed_ns), else the worker's clock */
int64_t job_run_ns(backend* be, const backend_hooks* hk, int64_t wall) {
  int64_t t = hk && hk->timed_ns ? hk->timed_ns(be) : -1;
  return t >= 0 ? t : wall;
}

int job_cmp_i64(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}


/* A failure that is the job running into one of its bounds is named as such: an allocation refused
 * under RLIMIT_DATA or the memory cgroup (the agent's own, a runtime's or a kernel's message), a
 * fork refused under the pids cgroup. */
static void classify_limit(run_state* r) {
  static const char* refused_memory[] = {"out of memory", "bad_alloc", "bad allocation", "failed to allocate",
                                         "unable to allocate", "cannot allocate", "memoryerror", "enomem"};
  static const char* refused_process[] = {"resource temporarily unavailable", "eagain"};
  if (r->status_ok || r->limit) return;
  char low[ERRLEN];
  size_t i;
  for (i = 0; r->reason[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)r->reason[i]);
  low[i] = 0;
  char was[ERRLEN];
  snprintf(was, sizeof was, "%s", r->reason);
  for (size_t k = 0; r->limits.memory_mb && k < sizeof refused_memory / sizeof *refused_memory; k++)
    if (strstr(low, refused_memory[k])) {
      r->limit = "memory";
      snprintf(r->reason, sizeof r->reason, "out of memory: %s (limit %lld MB; this process %.1f MB resident)", was,
               r->limits.memory_mb, (double)proc_resident_kb(0) / 1024.0);
      return;
    }
  for (size_t k = 0; r->limits.max_procs && k < sizeof refused_process / sizeof *refused_process; k++)
    if (strstr(low, refused_process[k])) {
      r->limit = "processes";
      snprintf(r->reason, sizeof r->reason, "too many processes: %s (limit %lld processes)", was, r->limits.max_procs);
      return;
    }
}

int cmd_run(const char* jobdir, const char* dir) {
  struct stat st;
  if (stat(jobdir, &st) || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "edgetune-agent: job directory %s does not exist\n", jobdir);
    return 2;
  }
  g_worker_pid = getpid();
  run_state r;
  memset(&r, 0, sizeof r);
  sb_init(&r.versions);
  sb_init(&r.details);
  snprintf(r.jobdir, sizeof r.jobdir, "%s", jobdir);
  snprintf(r.agent_dir, sizeof r.agent_dir, "%s", dir);
  r.late_iter = -1;
  run_job(&r);
  classify_limit(&r);
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
