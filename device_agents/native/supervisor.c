/* The supervisor of run-stdio: starts the worker, polls it against the job's bounds, sweeps what
 * it left, and writes the outcome (PROTOCOL.md "The supervisor"). */
#include "supervisor.h"

volatile sig_atomic_t g_stop_signal;
static void on_stop_signal(int sig) { g_stop_signal = sig; }

static void sv_reap(supervisor* sv) {
  for (;;) {
    int st;
    struct rusage ru;
    pid_t p = wait4(-1, &st, WNOHANG, &ru);
    if (p < 0 && errno == EINTR) continue;
    if (p <= 0) return;
    if (p == sv->worker) {
      sv->worker_done = 1;
      sv->worker_status = st;
      sv->worker_maxrss_kb = ru.ru_maxrss; /* KiB */
    }
  }
}

static void add_member(supervisor* sv, pid_t pid) {
  if (sv->n_members == sv->cap_members) {
    size_t cap = sv->cap_members ? sv->cap_members * 2 : 64;
    pid_t* v = (pid_t*)realloc(sv->members, cap * sizeof *v);
    if (!v) return;
    sv->members = v;
    sv->cap_members = cap;
  }
  sv->members[sv->n_members++] = pid;
}

int sv_violation(supervisor* sv, const char* limit, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sv->reason, sizeof sv->reason, fmt, ap);
  va_end(ap);
  sv->limit = limit;
  sv->status = "error";
  return 1;
}

/* one look: 1 when the job is over (the worker exited, a bound was broken, the agent was told to stop) */
static int sv_poll(supervisor* sv) {
  const limits_t* lim = &sv->lim;
  sv_reap(sv);
  if (sv->worker_done) return 1;
  if (g_stop_signal) return 1;
  int64_t now = now_ns();
  double elapsed = (double)(now - sv->started) / 1e9;
  if (lim->timeout_s > 0 && elapsed > lim->timeout_s)
    return sv_violation(sv, "time", "hung: still running after %.2f s (limit %g s)", elapsed, lim->timeout_s);
  sv->n_members = 0;
  if (cg_any(&sv->cg)) {
    pid_t* pids = NULL;
    size_t cap = 0;
    int n = cg_members(&sv->cg, &pids, &cap);
    for (int i = 0; i < n; i++) add_member(sv, pids[i]);
    free(pids);
  } else {
    long n = proc_tree_refresh(&sv->tree, now, lim->max_procs ? (long)lim->max_procs : LONG_MAX);
    if (lim->max_procs && n > lim->max_procs) {
      sv->peak_procs = sv->peak_procs > (int)n ? sv->peak_procs : (int)n;
      sv->leftover = (int)n - 1;
      return sv_violation(sv, "processes", "too many processes: at least %ld processes (limit %lld)", n,
                          lim->max_procs);
    }
    for (size_t i = 0; n >= 0 && i < sv->tree.known.n; i++)
      if (sv->tree.known.v[i].kind == 1) add_member(sv, sv->tree.known.v[i].pid);
  }
  if (lim->memory_mb && !sv->cg.mem.version) { /* statm of each: live ones only (a zombie holds nothing) */
    size_t alive = 0;
    sv->rss_kb = 0;
    for (size_t i = 0; i < sv->n_members; i++) {
      long long kb = proc_resident_kb(sv->members[i]);
      if (kb < 0) continue;
      sv->rss_kb += kb;
      sv->members[alive++] = sv->members[i];
    }
    sv->n_members = alive;
    if (sv->rss_kb > sv->peak_kb) sv->peak_kb = sv->rss_kb;
  }
  if ((int)sv->n_members > sv->peak_procs) sv->peak_procs = (int)sv->n_members;
  if (lim->max_procs && (long long)sv->n_members > lim->max_procs) {
    sv->leftover = (int)sv->n_members - 1;
    return sv_violation(sv, "processes", "too many processes: %d processes (limit %lld)", (int)sv->n_members,
                        lim->max_procs);
  }
  /* Forks refused by the pids cgroup at two looks in a row: a job that keeps trying to outgrow the
   * backstop. Its count of live processes may never pass max_procs: the cgroup counts threads and
   * zombies, cgroup.procs lists neither (under qemu-user every process is two tasks, and a child
   * that cannot start qemu's own thread dies, a zombie its parent never reaps: a fork bomb there
   * fills the cgroup with ~60 live processes and ~35 zombies and stays so until the deadline). */
  if (lim->max_procs && sv->cg.pids.version) {
    long long refused = cg_forks_refused(&sv->cg);
    int now_refusing = refused >= 0 ? refused > sv->forks_refused
                                    : cg_read_ll(&sv->cg.pids, "pids.current", "pids.current", NULL) >=
                                          pids_cgroup_max(lim->max_procs);
    if (refused >= 0) sv->forks_refused = refused;
    sv->refusing = now_refusing ? sv->refusing + 1 : 0;
    if (sv->refusing >= 2) {
      sv->leftover = (int)sv->n_members - 1;
      return sv_violation(sv, "processes", "too many processes: forks refused at the job's cgroup limit of %lld "
                          "tasks, %d processes running (limit %lld processes)", pids_cgroup_max(lim->max_procs),
                          (int)sv->n_members, lim->max_procs);
    }
  }
  if (!lim->memory_mb) return 0;
  if (sv->cg.mem.version) { /* the kernel enforces it; the peak is read once, at the end */
    long long kills = cg_oom_kills(&sv->cg);
    if (kills) {
      long long peak = cg_memory_bytes(&sv->cg, 1);
      if (peak <= 0) peak = cg_memory_bytes(&sv->cg, 0);
      return sv_violation(sv, "memory", "out of memory: the kernel's OOM killer stopped %lld process(es) of the job "
                          "in its memory cgroup (peak %.1f MB; limit %lld MB)", kills, (double)peak / 1048576.0,
                          lim->memory_mb);
    }
    return 0;
  }
  if (sv->rss_kb <= lim->memory_mb * 1024 || now < sv->next_pss) return 0;
  /* resident pages shared between forked processes count once in each: the proportional set size
   * (costlier: the kernel walks the page tables) confirms before the job is stopped */
  int64_t t0 = now_ns();
  long long pss = 0;
  int known = 1;
  for (size_t i = 0; i < sv->n_members && known; i++) {
    long long kb = proc_pss_kb(sv->members[i]);
    if (kb < 0) known = 0;
    else pss += kb;
  }
  int64_t cost = WORK_FACTOR * (now_ns() - t0);
  sv->next_pss = now + (cost > PSS_EVERY_NS ? cost : PSS_EVERY_NS);
  if (!known)
    return sv_violation(sv, "memory", "out of memory: %.1f MB resident in %d processes (limit %lld MB)",
                        (double)sv->rss_kb / 1024.0, (int)sv->n_members, lim->memory_mb);
  if (pss > lim->memory_mb * 1024)
    return sv_violation(sv, "memory", "out of memory: %.1f MB in %d processes (proportional set size; limit %lld MB)",
                        (double)pss / 1024.0, (int)sv->n_members, lim->memory_mb);
  return 0;
}

static void sv_watch(supervisor* sv) {
  for (;;) {
    int64_t t0 = now_ns();
    if (sv_poll(sv)) return;
    int64_t pause = WORK_FACTOR * (now_ns() - t0);
    if (pause < POLL_NS) pause = POLL_NS;
    if (pause > POLL_MAX_NS) pause = POLL_MAX_NS;
    struct timespec ts = {(time_t)(pause / 1000000000LL), (long)(pause % 1000000000LL)};
    nanosleep(&ts, NULL);
  }
}

/* Kill every process of the job and reap until none is left. A fork bomb ends too: each pass kills
 * all it finds, their children come to the supervisor (the subreaper), the next pass kills those; it
 * is over when the supervisor has no child left at all. */
static void sv_sweep(supervisor* sv) {
  int64_t give_up = now_ns() + SWEEP_GIVE_UP_NS;
  proc_list l = {NULL, 0, 0};
  pid_t* pids = NULL;
  size_t cap = 0;
  int count = sv->worker_done; /* a job that ended by itself: what it left running is counted */
  int64_t pause = 500000LL;
  int prev_live = 0;
  for (int first = 1;; first = 0) {
    /* the worker's whole group at once, first (a fork bomb that keeps its group cannot outrun one
     * kill); not reaped yet, the group id is still the job's */
    if (!sv->worker_done) kill(-sv->worker, SIGKILL);
    int live = 0;
    if (proc_list_pids(&l) == 0) {
      for (size_t i = 0; i < l.n; i++) l.v[i].kind = l.v[i].pid == sv->me || proc_stat(&l.v[i]) ? 2 : 3;
      proc_mark_descendants(&l, sv->me);
      int procfd = sv->subreaper ? -1 : open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      for (size_t i = 0; procfd >= 0 && i < l.n; i++) {
        char name[24];
        snprintf(name, sizeof name, "%d", (int)l.v[i].pid);
        if (l.v[i].kind == 2 && l.v[i].pid != sv->me && sv_runs_this_job(procfd, name, sv->jobdir)) l.v[i].kind = 1;
      }
      if (procfd >= 0) close(procfd);
      for (size_t i = 0; i < l.n; i++)
        if (l.v[i].kind == 1 && l.v[i].state != 'Z') {
          live++;
          if (first && count && l.v[i].pid != sv->worker) sv->leftover++;
        }
    }
    for (size_t i = 0; i < l.n; i++)
      if (l.v[i].kind == 1 && l.v[i].state != 'Z') kill(l.v[i].pid, SIGKILL);
    cg_kill_all(&sv->cg, &pids, &cap);
    sv_reap(sv);
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (!live && waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) && errno == ECHILD) break;
    if (now_ns() > give_up) {
      sv->unkillable = live;
      break;
    }
    /* killed processes need the CPU to exit: a supervisor (at the highest priority where it may)
     * that looked every millisecond took it from them (the Python agent's killed worker took 7 s to
     * go on a loaded machine). While a pass finds no more processes than the last, the looks back
     * off to SWEEP_POLL_MAX_NS; more (a fork bomb's) bring them back to every millisecond */
    pause = live > prev_live ? 1000000LL : pause * 2 > SWEEP_POLL_MAX_NS ? SWEEP_POLL_MAX_NS : pause * 2;
    prev_live = live;
    struct timespec ts = {(time_t)(pause / 1000000000LL), (long)(pause % 1000000000LL)};
    nanosleep(&ts, NULL);
  }
  free(l.v);
  free(pids);
}

/* what the job came to when no bound was broken: NULL status to relay the worker's own result */
static void sv_outcome(supervisor* sv) {
  long long maxrss = sv->worker_done ? sv->worker_maxrss_kb : 0, peak = cg_memory_bytes(&sv->cg, 1);
  if (maxrss > sv->peak_kb) sv->peak_kb = maxrss;
  if (peak / 1024 > sv->peak_kb) sv->peak_kb = peak / 1024;
  if (sv->limit || !sv->worker_done) return;
  int st = sv->worker_status;
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    const char* name = sv_signal_name(sig);
    char num[32];
    snprintf(num, sizeof num, "signal %d", sig);
    /* an allocation refused under RLIMIT_DATA or the memory cgroup often ends as a NULL dereference,
     * an abort or the OOM killer's SIGKILL: past the bound, that is what it was */
    if (sv->lim.memory_mb && (cg_oom_kills(&sv->cg) || maxrss > sv->lim.memory_mb * 1024)) {
      sv_violation(sv, "memory", "out of memory: the worker was killed by %s at %.1f MB resident (limit %lld MB)",
                   name ? name : num, (double)maxrss / 1024.0, sv->lim.memory_mb);
      return;
    }
    if (sig == SIGXFSZ && sv->lim.max_bundle) {
      sv_violation(sv, "output", "result too large: a file of the job grew past %lld bytes (limit %lld bytes)",
                   sv->lim.max_bundle, sv->lim.max_bundle);
      return;
    }
    sv->status = "crashed";
    sv->signal = name ? name : "unknown";
    snprintf(sv->reason, sizeof sv->reason, "crashed: the worker was killed by %s", name ? name : num);
    return;
  }
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/result.json", sv->jobdir);
  if (access(path, F_OK)) {
    sv->status = "crashed";
    snprintf(sv->reason, sizeof sv->reason, "crashed: the worker exited with status %d and no result",
             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
}

/* the supervisor's own fields, ending the result object: '"limits_enforced": ..., ...}' */
void sv_fields(const supervisor* sv, sbuf* o) {
  const char* en[5] = {sv->enforced_memory, sv->enforced_processes, sv->lim.timeout_s > 0 ? "supervisor" : NULL,
                       sv->lim.max_bundle ? "supervisor" : NULL, sv->subreaper ? "subreaper" : "process group+cmdline"};
  const char* keys[5] = {"memory", "processes", "time", "output", "leftovers"};
  sb_raw(o, "\"limits_enforced\":{");
  for (int i = 0; i < 5; i++) {
    sb_printf(o, "%s\"%s\":", i ? "," : "", keys[i]);
    sb_str(o, en[i]);
  }
  sb_printf(o, "},\"leftover_processes\":%d,\"usage\":{\"wall_s\":", sv->leftover);
  sb_double(o, round((double)(now_ns() - sv->started) / 1e6) / 1e3);
  sb_raw(o, ",\"peak_memory_mb\":");
  sb_double(o, round((double)sv->peak_kb / 102.4) / 10.0);
  sb_printf(o, ",\"peak_procs\":%d}", sv->peak_procs);
  if (sv->unkillable) sb_printf(o, ",\"unkillable_processes\":%d", sv->unkillable);
  sb_raw(o, "}");
}

static void close_transport_fds(void) {
  /* pipes and sockets only: under qemu-user the emulator's own descriptors are in this table too */
  int fds[256], n = 0;
  DIR* d = opendir("/proc/self/fd");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL && n < 256) {
    int fd = atoi(e->d_name);
    struct stat st;
    if (fd > 2 && fd != dirfd(d) && !fstat(fd, &st) && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) fds[n++] = fd;
  }
  if (d) closedir(d);
  for (int i = 0; i < n; i++) close(fds[i]);
}

static void become_worker(supervisor* sv, int go, const char* dir) {
  int sigs[] = {SIGTERM, SIGHUP, SIGINT, SIGPIPE, SIGXFSZ};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], SIG_DFL);
  setpgid(0, 0); /* its own process group: killed as one */
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != sv->me) _exit(70); /* the supervisor died before the line above */
  struct rlimit core = {0, 0};
  setrlimit(RLIMIT_CORE, &core);
  if (sv->lim.memory_mb) sv_lower_rlimit(RLIMIT_DATA, sv_data_limit_bytes(sv->lim.memory_mb));
  if (sv->lim.max_bundle) sv_lower_rlimit(RLIMIT_FSIZE, (rlim_t)sv->lim.max_bundle); /* no file outgrows the bundle */
  if (sv->nproc) sv_lower_rlimit(RLIMIT_NPROC, (rlim_t)sv->nproc);
  /* nothing the candidate prints reaches the result stream, and it holds none of the transport's pipes */
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", sv->jobdir, LOG_NAME);
  int log = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600), null = open("/dev/null", O_RDONLY);
  if (log < 0 || null < 0) _exit(71);
  dup2(null, 0);
  dup2(log, 1);
  dup2(log, 2);
  char c;
  while (read(go, &c, 1) < 0 && errno == EINTR) {
  }
  close(go);
  close(log);
  close(null);
  close_transport_fds();
  int rc = cmd_run(sv->jobdir, dir);
  fflush(NULL);
  _exit(rc);
}

static int sv_start(supervisor* sv, const char* dir) {
  /* orphans of the job, even after setsid + double fork, come here */
  sv->subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
  char tag[32];
  snprintf(tag, sizeof tag, "%d", (int)sv->me);
  cg_setup(&sv->cg, tag, sv->lim.memory_mb, sv->lim.max_procs);
  int rlimit = sv_rlimit_data_takes();
  sv->enforced_memory = !sv->lim.memory_mb ? NULL : sv->cg.mem.version ? "cgroup" : rlimit ? "rlimit+poll" : "poll";
  /* no pids cgroup: RLIMIT_NPROC stops a fork bomb in the kernel instead, between polls; it counts
   * every task of the user on the device (so: what it has now plus the job's allowance) and binds
   * no one running as root */
  long long tasks = sv->lim.max_procs && !sv->cg.pids.version && getuid() != 0 ? sv_user_tasks() : -1;
  if (tasks >= 0) sv->nproc = tasks + pids_cgroup_max(sv->lim.max_procs);
  sv->enforced_processes = !sv->lim.max_procs ? NULL : sv->cg.pids.version ? "cgroup+poll"
                           : sv->nproc ? "rlimit+poll" : "poll";
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  int go[2];
  if (pipe(go)) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(go[0]);
    close(go[1]);
    return -1;
  }
  if (pid == 0) {
    close(go[1]);
    become_worker(sv, go[0], dir);
    _exit(70);
  }
  close(go[0]);
  sv->worker = pid;
  setpgid(pid, pid); /* also done by the worker: whichever runs first */
  /* a job that saturates every core (a fork bomb) must not starve the one process that can stop it:
   * where it may (root, CAP_SYS_NICE) the supervisor, asleep nearly all the time, takes the highest
   * priority of the fair scheduler; the worker keeps the one it was started with */
  setpriority(PRIO_PROCESS, 0, -20);
  cg_add(&sv->cg, pid);
  ssize_t w = write(go[1], "g", 1); /* the worker starts once it is in its cgroups */
  (void)w;
  close(go[1]);
  return 0;
}

static int rm_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st; (void)flag; (void)ftw;
  remove(path);
  return 0;
}

/* run-stdio: one round trip per job. The request comes on stdin; the job runs in a worker process
 * under this one, the supervisor, which streams result.json and every output file to stdout as a bundle
 *   "EDGETUNE-BUNDLE 1\n" { "NAME SIZE\n" BYTES }* "END\n"
 * and removes the job dir. */
int cmd_run_stdio(const char* jobdir, const char* dir) {
  supervisor sv;
  memset(&sv, 0, sizeof sv);
  sv.started = now_ns();
  sv.me = getpid();
  sv.tree.root = sv.me;
  if (mkdir(jobdir, 0700) && errno != EEXIST) {
    fprintf(stderr, "edgetune-agent: cannot create %s: %s\n", jobdir, strerror(errno));
    return 2;
  }
  snprintf(sv.jobdir, sizeof sv.jobdir, "%s", jobdir);
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/request.json", jobdir);
  FILE* f = fopen(path, "wb");
  if (!f) { fprintf(stderr, "edgetune-agent: cannot write %s\n", path); return 2; }
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) fwrite(buf, 1, n, f);
  if (fclose(f)) { fprintf(stderr, "edgetune-agent: cannot write %s\n", path); return 2; }
  char err[ERRLEN];
  char* text = et_read_text(path, 64u << 20);
  jval* req = text ? json_parse(text, err, sizeof err) : NULL;
  free(text);
  if (req && req->type == J_OBJ && job_parse_limits(req, &sv.lim, err, sizeof err)) { /* unreadable: the worker says so */
    snprintf(sv.reason, sizeof sv.reason, "bad request: %s", err);
    sv.status = "error";
  }
  json_free(req);
  if (!sv.status && sv_start(&sv, dir)) {
    snprintf(sv.reason, sizeof sv.reason, "cannot start the job's worker: %s", strerror(errno));
    sv.status = "error";
  }
  if (sv.worker) {
    sv_watch(&sv);
    sv_sweep(&sv);
    sv_outcome(&sv);
    cg_remove(&sv.cg);
  }
  int stop = g_stop_signal;
  snprintf(path, sizeof path, "%s/%s", jobdir, LOG_NAME);
  int log = open(path, O_RDONLY | O_CLOEXEC);
  if (log >= 0) { /* the tail of what the worker printed, on the agent's stderr (diagnostics only) */
    off_t len = lseek(log, 0, SEEK_END);
    ssize_t got = len > 0 ? pread(log, buf, LOG_TAIL, len > LOG_TAIL ? len - LOG_TAIL : 0) : 0;
    if (got > 0) {
      fwrite(buf, 1, (size_t)got, stderr);
      if (buf[got - 1] != '\n') fputc('\n', stderr);
    }
    close(log);
  }
  if (!stop) sv_emit_bundle(&sv); /* told to stop: the host gave up on this job, nobody reads a bundle */
  nftw(jobdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(sv.members);
  free(sv.tree.known.v);
  free(sv.tree.next.v);
  return stop ? 128 + stop : 0;
}
