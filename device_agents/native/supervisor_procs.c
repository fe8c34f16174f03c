/* The supervisor's view of the job's processes from /proc: small file reads, resident and
 * proportional memory, signal names, and the job's process tree. */
#include "supervisor.h"

static long long page_kb(void) {
  long p = sysconf(_SC_PAGESIZE);
  return (p > 0 ? p : 4096) / 1024;
}

/* a small file into buf, NUL-terminated: its length, or -1 */
ssize_t sv_read_small(const char* path, char* buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = 0;
  while (len + 1 < cap) {
    ssize_t n = read(fd, buf + len, cap - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(fd);
  buf[len] = 0;
  return (ssize_t)len;
}

int sv_write_small(const char* path, const char* text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = strlen(text);
  int ok = write(fd, text, len) == (ssize_t)len;
  if (close(fd)) ok = 0;
  return ok ? 0 : -1;
}

/* resident memory of a live process (0: this one) in KiB; -1 when it is gone or a zombie */
long long proc_resident_kb(pid_t pid) {
  char path[64], buf[256];
  if (pid) snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
  else snprintf(path, sizeof path, "/proc/self/statm");
  long long size = 0, rss = 0;
  if (sv_read_small(path, buf, sizeof buf) <= 0 || sscanf(buf, "%lld %lld", &size, &rss) != 2 || size == 0) return -1;
  return rss * page_kb();
}

/* proportional set size in KiB (pages shared between forked processes count once, split), or -1 */
long long proc_pss_kb(pid_t pid) {
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
  if (sv_read_small(path, buf, sizeof buf) <= 0) return -1;
  const char* p = strstr(buf, "\nPss:");
  return p ? strtoll(p + 5, NULL, 10) : -1;
}

int sv_has_word(const char* list, const char* word, char sep) {
  size_t n = strlen(word);
  for (const char* p = list; p && *p;) {
    const char* end = strchr(p, sep);
    size_t len = end ? (size_t)(end - p) : strlen(p);
    while (len && (p[len - 1] == '\n' || p[len - 1] == ' ')) len--;
    if (len == n && !strncmp(p, word, n)) return 1;
    p = end ? end + 1 : NULL;
  }
  return 0;
}

const char* sv_signal_name(int sig) {
  static const struct { int sig; const char* name; } names[] = {
    {SIGHUP, "SIGHUP"}, {SIGINT, "SIGINT"}, {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"}, {SIGTRAP, "SIGTRAP"},
    {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"}, {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},
    {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
    {SIGCHLD, "SIGCHLD"}, {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGVTALRM, "SIGVTALRM"},
    {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"}, {SIGSYS, "SIGSYS"},
  };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (names[i].sig == sig) return names[i].name;
  return NULL;
}

/* ---- processes in /proc */
static int cmp_pid(const void* a, const void* b) {
  pid_t x = ((const proc_ent*)a)->pid, y = ((const proc_ent*)b)->pid;
  return x < y ? -1 : x > y;
}

static proc_ent* find_pid(const proc_list* l, pid_t pid) {
  proc_ent key = {pid, 0, 0, 0};
  return l->n ? (proc_ent*)bsearch(&key, l->v, l->n, sizeof *l->v, cmp_pid) : NULL;
}

/* every pid in /proc, sorted, not looked at yet */
int proc_list_pids(proc_list* l) {
  l->n = 0;
  DIR* d = opendir("/proc");
  if (!d) return -1;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    if (l->n == l->cap) {
      size_t cap = l->cap ? l->cap * 2 : 1024;
      proc_ent* v = (proc_ent*)realloc(l->v, cap * sizeof *v);
      if (!v) break;
      l->v = v;
      l->cap = cap;
    }
    l->v[l->n++] = (proc_ent){(pid_t)atoi(e->d_name), 0, 0, 0};
  }
  closedir(d);
  qsort(l->v, l->n, sizeof *l->v, cmp_pid);
  return 0;
}

int proc_stat(proc_ent* e) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)e->pid);
  if (sv_read_small(path, buf, sizeof buf) <= 0) return -1;
  const char* rp = strrchr(buf, ')'); /* the name may hold ") " */
  int ppid;
  char state;
  if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2) return -1;
  e->ppid = (pid_t)ppid;
  e->state = state;
  return 0;
}

/* place every process read but not placed (kind 3): the job's (1) when it descends from root, else 2;
 * the number placed in the job */
long proc_mark_descendants(proc_list* l, pid_t root) {
  long added = 0;
  for (int grew = 1; grew;) { /* a new process may be the child of another new one */
    grew = 0;
    for (size_t i = 0; i < l->n; i++) {
      if (l->v[i].kind != 3) continue;
      proc_ent* parent = l->v[i].ppid == root ? NULL : find_pid(l, l->v[i].ppid);
      if (l->v[i].ppid == root || (parent && parent->kind == 1)) {
        l->v[i].kind = 1;
        added++;
        grew = 1;
      }
    }
  }
  for (size_t i = 0; i < l->n; i++)
    if (l->v[i].kind == 3) l->v[i].kind = 2;
  return added;
}

/* the number of the job's processes (t->known holds them), or -1; more than stop: it stops reading
 * at once and returns stop + 1 (a fork bomb is stopped at its first step past the bound, not after
 * the supervisor read the thousands of processes it made meanwhile) */
long proc_tree_refresh(tree_t* t, int64_t now, long stop) {
  if (proc_list_pids(&t->next)) return -1;
  int rescan = now >= t->next_rescan;
  if (rescan) t->next_rescan = now + RESCAN_NS;
  long members = 0;
  for (size_t i = 0; i < t->next.n; i++) {
    proc_ent* e = &t->next.v[i];
    const proc_ent* old = rescan ? NULL : find_pid(&t->known, e->pid);
    if (old) members += (*e = *old).kind == 1;
    else if (e->pid == t->root) e->kind = 2;
  }
  for (size_t i = 0; i < t->next.n; i++) { /* new pids, ascending: a parent mostly before its children */
    proc_ent* e = &t->next.v[i];
    if (e->kind) continue;
    if (proc_stat(e)) {
      e->kind = 2;
      continue;
    }
    const proc_ent* parent = e->ppid == t->root ? NULL : find_pid(&t->next, e->ppid);
    e->kind = e->ppid == t->root || (parent && parent->kind == 1) ? 1 : 3;
    if (e->kind == 1 && ++members > stop) return members;
  }
  members += proc_mark_descendants(&t->next, t->root);
  proc_list swap = t->known;
  t->known = t->next;
  t->next = swap;
  return members;
}
