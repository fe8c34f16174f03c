/* The job's own cgroups (memory, pids) and the worker's rlimits. */
#include "supervisor.h"

/* ---- cgroups: the job's own for memory and pids, where the device lets the agent make them (a
 * child of the agent's cgroup in a cgroup v2 hierarchy that has the controller, a delegated subtree;
 * else in a writable v1 hierarchy of that controller). A step that fails leaves that controller to
 * the rlimit and the poll: a job never fails for want of a cgroup. */
static int cg_mounts(cg_mount* out, int max) {
  char* text = et_read_text("/proc/self/mountinfo", 1 << 20);
  int n = 0;
  for (char* line = text; line && *line && n < max;) {
    char* nl = strchr(line, '\n');
    if (nl) *nl = 0;
    char* sep = strstr(line, " - ");
    char fstype[32], src[256];
    if (sep) {
      *sep = 0;
      cg_mount* m = &out[n];
      if (sscanf(line, "%*s %*s %*s %4095s %4095s", m->root, m->mnt) == 2 &&
          sscanf(sep + 3, "%31s %255s %255s", fstype, src, m->opts) == 3 &&
          (!strcmp(fstype, "cgroup") || !strcmp(fstype, "cgroup2"))) {
        snprintf(m->fstype, sizeof m->fstype, "%s", fstype);
        n++;
      }
    }
    line = nl ? nl + 1 : NULL;
  }
  free(text);
  return n;
}

/* this process's cgroup in the hierarchy of ctl ("" for cgroup v2) */
static int cg_own(const char* ctl, char* out, size_t outlen) {
  char* text = et_read_text("/proc/self/cgroup", 1 << 16);
  int rc = -1;
  for (char* line = text; line && *line && rc;) {
    char* nl = strchr(line, '\n');
    if (nl) *nl = 0;
    char* c1 = strchr(line, ':');
    char* c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (c2) {
      *c2 = 0;
      if (*ctl ? sv_has_word(c1 + 1, ctl, ',') : c2 == c1 + 1) {
        snprintf(out, outlen, "%s", c2 + 1);
        rc = 0;
      }
    }
    line = nl ? nl + 1 : NULL;
  }
  free(text);
  return rc;
}

static int cg_pids(const char* dir, pid_t** pids, size_t* cap) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/cgroup.procs", dir);
  char* text = et_read_text(path, 1 << 22);
  if (!text) return 0;
  int n = 0;
  for (char* p = text; *p;) {
    char* end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    if ((size_t)n == *cap) {
      size_t c = *cap ? *cap * 2 : 256;
      pid_t* np = (pid_t*)realloc(*pids, c * sizeof *np);
      if (!np) break;
      *pids = np;
      *cap = c;
    }
    (*pids)[n++] = (pid_t)v;
    p = end;
  }
  free(text);
  return n;
}

static void cg_rmdir(const char* dir) {
  for (int i = 0; i < 200 && rmdir(dir) && errno != ENOENT; i++) { /* a killed task leaves a moment after */
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* cgroups a killed supervisor left behind (its pid gone): their processes die here */
static void cg_clean_stale(const char* base) {
  DIR* d = opendir(base);
  struct dirent* e;
  pid_t* pids = NULL;
  size_t cap = 0;
  while (d && (e = readdir(d)) != NULL) {
    char* end;
    long owner = strncmp(e->d_name, "edgetune-", 9) ? 0 : strtol(e->d_name + 9, &end, 10);
    if (owner <= 0 || *end || !(kill((pid_t)owner, 0) && errno == ESRCH)) continue;
    char dir[PATH_MAX + 300];
    snprintf(dir, sizeof dir, "%s/%s", base, e->d_name);
    for (int round = 0, n; round < 100 && (n = cg_pids(dir, &pids, &cap)) > 0; round++) {
      for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    cg_rmdir(dir);
  }
  if (d) closedir(d);
  free(pids);
}

static int cg_make(cgroups_t* cg, const char* ctl, const char* tag, const cg_mount* mounts, int n_mounts, cg_t* out) {
  for (int i = 0; i < n_mounts; i++) {
    const cg_mount* m = &mounts[i];
    int v2 = !strcmp(m->fstype, "cgroup2");
    char own[PATH_MAX], base[PATH_MAX * 2 + 8], file[PATH_MAX * 2 + 64], buf[1024];
    if ((!v2 && !sv_has_word(m->opts, ctl, ',')) || cg_own(v2 ? "" : ctl, own, sizeof own)) continue;
    size_t rl = strlen(m->root);
    const char* rel = strcmp(m->root, "/") && !strncmp(own, m->root, rl) ? own + rl : own;
    snprintf(base, sizeof base, "%s%s", m->mnt, rel);
    if (v2) {
      snprintf(file, sizeof file, "%s/cgroup.controllers", base);
      if (sv_read_small(file, buf, sizeof buf) < 0 || !sv_has_word(buf, ctl, ' ')) continue;
      snprintf(file, sizeof file, "%s/cgroup.subtree_control", base);
      char plus[32];
      snprintf(plus, sizeof plus, "+%s", ctl);
      if (sv_read_small(file, buf, sizeof buf) < 0 || (!sv_has_word(buf, ctl, ' ') && sv_write_small(file, plus))) continue;
    }
    cg_clean_stale(base);
    snprintf(out->dir, sizeof out->dir, "%s/edgetune-%s", base, tag);
    int made = 0;
    for (int k = 0; k < cg->n_made; k++) made |= !strcmp(cg->made[k], out->dir);
    if (!made) {
      if (mkdir(out->dir, 0700) || cg->n_made == 2) continue;
      snprintf(cg->made[cg->n_made++], PATH_MAX, "%s", out->dir);
    }
    snprintf(file, sizeof file, "%s/%s", out->dir,
             v2 ? (strcmp(ctl, "memory") ? "pids.max" : "memory.max")
                : (strcmp(ctl, "memory") ? "pids.max" : "memory.limit_in_bytes"));
    if (access(file, F_OK)) continue;
    out->version = v2 ? 2 : 1;
    return 0;
  }
  return -1;
}

static int cg_set(const cg_t* c, const char* name, long long value, int needed) {
  char path[PATH_MAX + 64], text[32];
  snprintf(path, sizeof path, "%s/%s", c->dir, name);
  snprintf(text, sizeof text, "%lld", value);
  return sv_write_small(path, text) && needed ? -1 : 0;
}

/* pids.max counts threads too: room for every process's runtime threads above max_procs, which the
 * poll enforces on processes alone. The cgroup is the backstop that stops a fork bomb between polls. */
long long pids_cgroup_max(long long max_procs) { return max_procs + 64 + 16LL * cpu_count(); }

void cg_setup(cgroups_t* cg, const char* tag, long long memory_mb, long long max_procs) {
  memset(cg, 0, sizeof *cg);
  const char* env = getenv("EDGETUNE_AGENT_CGROUP"); /* "0": the path phones without cgroups take (tests) */
  if (env && !strcmp(env, "0")) return;
  cg_mount* mounts = (cg_mount*)calloc(32, sizeof *mounts);
  int n = mounts ? cg_mounts(mounts, 32) : 0;
  if (memory_mb && !cg_make(cg, "memory", tag, mounts, n, &cg->mem)) {
    long long bytes = memory_mb << 20;
    int v2 = cg->mem.version == 2;
    if (cg_set(&cg->mem, v2 ? "memory.max" : "memory.limit_in_bytes", bytes, 1)) cg->mem.version = 0;
    cg_set(&cg->mem, v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes", v2 ? 0 : bytes, 0); /* no swap */
    cg_set(&cg->mem, v2 ? "memory.oom.group" : "memory.swappiness", v2 ? 1 : 0, 0); /* v2: the job dies as one */
  }
  if (max_procs && !cg_make(cg, "pids", tag, mounts, n, &cg->pids))
    if (cg_set(&cg->pids, "pids.max", pids_cgroup_max(max_procs), 1)) cg->pids.version = 0;
  free(mounts);
  for (int k = 0; k < cg->n_made; k++)
    if ((!cg->mem.version || strcmp(cg->made[k], cg->mem.dir)) && (!cg->pids.version || strcmp(cg->made[k], cg->pids.dir))) {
      cg_rmdir(cg->made[k]);
      cg->made[k][0] = 0;
    }
}

int cg_any(const cgroups_t* cg) { return cg->mem.version || cg->pids.version; }

void cg_add(cgroups_t* cg, pid_t pid) {
  char path[PATH_MAX + 32], text[32];
  snprintf(text, sizeof text, "%d", (int)pid);
  cg_t* both[2] = {&cg->mem, &cg->pids};
  for (int i = 0; i < 2; i++) {
    if (!both[i]->version) continue;
    snprintf(path, sizeof path, "%s/cgroup.procs", both[i]->dir);
    if (sv_write_small(path, text)) both[i]->version = 0;
  }
}

/* Whether a process (of this user) runs this very job although it is not in the supervisor's tree:
 * without a subreaper (qemu-user refuses PR_SET_CHILD_SUBREAPER) an orphan of the job goes to init,
 * but a fork of the agent still shows its command line, which ends in "run-stdio" and the job dir
 * (unique per job). A process that execs or rewrites its argv escapes this; not a subreaper. */
int sv_runs_this_job(int procfd, const char* name, const char* jobdir) {
  struct stat st;
  if (fstatat(procfd, name, &st, 0) || st.st_uid != getuid()) return 0;
  char path[300], buf[8192];
  snprintf(path, sizeof path, "/proc/%s/cmdline", name);
  ssize_t n = sv_read_small(path, buf, sizeof buf);
  size_t jl = strlen(jobdir), tail = sizeof "run-stdio" + jl + 1;
  if (n <= 0 || (size_t)n < tail || buf[n - 1]) return 0;
  const char* t = buf + n - tail;
  return (t == buf || t[-1] == 0) && !memcmp(t, "run-stdio", sizeof "run-stdio") && !memcmp(t + sizeof "run-stdio", jobdir, jl + 1);
}

/* the job's processes by its cgroups (one, or two v1 hierarchies with the same members) */
int cg_members(const cgroups_t* cg, pid_t** pids, size_t* cap) {
  return cg_pids(cg->pids.version ? cg->pids.dir : cg->mem.dir, pids, cap);
}

long long cg_read_ll(const cg_t* c, const char* v1, const char* v2, const char* key) {
  char path[PATH_MAX + 64], buf[4096];
  snprintf(path, sizeof path, "%s/%s", c->dir, c->version == 2 ? v2 : v1);
  if (sv_read_small(path, buf, sizeof buf) <= 0) return -1;
  if (!key) return strtoll(buf, NULL, 10);
  const char* p = strstr(buf, key);
  return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* processes of the job the kernel's OOM killer stopped in its memory cgroup (v1 kernels before 4.13
 * have no counter: then the times the limit was hit) */
long long cg_oom_kills(const cgroups_t* cg) {
  if (!cg->mem.version) return 0;
  long long k = cg_read_ll(&cg->mem, "memory.oom_control", "memory.events", "oom_kill ");
  if (k < 0 && cg->mem.version == 1) k = cg_read_ll(&cg->mem, "memory.failcnt", "", NULL);
  return k > 0 ? k : 0;
}

long long cg_memory_bytes(const cgroups_t* cg, int peak) {
  if (!cg->mem.version) return -1;
  return peak ? cg_read_ll(&cg->mem, "memory.max_usage_in_bytes", "memory.peak", NULL)
              : cg_read_ll(&cg->mem, "memory.usage_in_bytes", "memory.current", NULL);
}

/* forks the job's pids cgroup refused so far (its pids.events counter), or -1 (a kernel before 4.8: none) */
long long cg_forks_refused(const cgroups_t* cg) {
  return cg->pids.version ? cg_read_ll(&cg->pids, "pids.events", "pids.events", "max ") : -1;
}

void cg_kill_all(const cgroups_t* cg, pid_t** pids, size_t* cap) {
  const cg_t* both[2] = {&cg->mem, &cg->pids};
  for (int i = 0; i < 2; i++) {
    if (!both[i]->version) continue;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/cgroup.kill", both[i]->dir);
    if (both[i]->version == 2) sv_write_small(path, "1");
    int n = cg_pids(both[i]->dir, pids, cap);
    for (int k = 0; k < n; k++) kill((*pids)[k], SIGKILL);
  }
}

void cg_remove(cgroups_t* cg) {
  for (int k = 0; k < cg->n_made; k++)
    if (cg->made[k][0]) cg_rmdir(cg->made[k]);
  cg->n_made = 0;
}

/* ---- rlimits */
/* RLIMIT_DATA of the worker: a per-process backstop, not the bound itself. It counts writable memory
 * reserved but never touched (8 MB per thread stack, allocator arenas, BLAS buffers: numpy alone
 * reserves ~115 MB for ~47 MB resident, onnxruntime with 8 threads 179 MB for 78 MB), so at memory_mb
 * it would refuse honest runtimes; the bound on resident memory is the cgroup or the poll. RLIMIT_AS
 * (every mapping, even PROT_NONE reservations: 740 MB for that onnxruntime) is worse. */
rlim_t sv_data_limit_bytes(long long memory_mb) { return (rlim_t)(2 * memory_mb + 256) << 20; }

/* whether RLIMIT_DATA binds here: qemu-user accepts it for a guest and ignores it */
int sv_rlimit_data_takes(void) {
  struct rlimit old, probe, got;
  if (getrlimit(RLIMIT_DATA, &old) || (old.rlim_max != RLIM_INFINITY && old.rlim_max < 8192)) return 0;
  probe = old;
  probe.rlim_cur = (old.rlim_max == RLIM_INFINITY ? RLIM_INFINITY : old.rlim_max) - 4096;
  if (setrlimit(RLIMIT_DATA, &probe)) return 0;
  int took = !getrlimit(RLIMIT_DATA, &got) && got.rlim_cur == probe.rlim_cur;
  setrlimit(RLIMIT_DATA, &old);
  return took;
}

/* tasks (threads) the real user has now: what RLIMIT_NPROC counts, across the whole device */
long long sv_user_tasks(void) {
  DIR* d = opendir("/proc");
  if (!d) return -1;
  long long n = 0;
  uid_t me = getuid();
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (!isdigit((unsigned char)e->d_name[0]) || fstatat(dirfd(d), e->d_name, &st, 0) || st.st_uid != me) continue;
    char path[300], buf[4096];
    snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
    const char* t = sv_read_small(path, buf, sizeof buf) > 0 ? strstr(buf, "\nThreads:") : NULL;
    n += t ? strtoll(t + 9, NULL, 10) : 1;
  }
  closedir(d);
  return n;
}

void sv_lower_rlimit(int which, rlim_t value) {
  struct rlimit r;
  if (getrlimit(which, &r)) return;
  if (r.rlim_max != RLIM_INFINITY && value > r.rlim_max) value = r.rlim_max;
  r.rlim_cur = r.rlim_max = value;
  setrlimit(which, &r);
}
