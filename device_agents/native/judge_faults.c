/* The judge's parent side: fault records, the child's death classified, the round trip, detect mode. */
#include "judge_internal.h"

/* ------------------------------------------------------------------ faults */

static const char* kClassCode[] = {"crashed", "forbidden-exec", "forbidden-process", "forbidden-network",
                                   "forbidden-file", "forbidden-syscall"};

void jb_set_fault(judge_state* s, const char* code, const char* fmt, ...) {
  if (s->fault_code[0]) return; /* the first one wins */
  snprintf(s->fault_code, sizeof s->fault_code, "%s", code);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->fault_detail, sizeof s->fault_detail, fmt, ap);
  va_end(ap);
  for (char* c = s->fault_detail; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
}

/* ------------------------------------------------------------------ the parent's side */

static const char* sig_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGSYS: return "SIGSYS";
    case SIGKILL: return "SIGKILL";
    case SIGABRT: return "SIGABRT";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGPIPE: return "SIGPIPE";
    case SIGTRAP: return "SIGTRAP";
    default: return NULL;
  }
}

static void name_buffer(judge_state* s, const jbuf* b, char* out, size_t outlen) {
  int idx = -1;
  for (int k = 0; k < (b->is_input ? s->n_in : s->n_out); k++)
    if (&s->bufs[b->is_input ? s->in_idx[k] : s->out_idx[k]] == b) idx = k;
  snprintf(out, outlen, "%s %d", b->is_input ? "input" : "output", idx);
}

/* the child is gone: what happened, as a fault */
void jb_classify_death(judge_state* s) {
  int st = s->child_status;
  ctl_page* c = s->ctl;
  if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_FAULT && c->fault && c->f_sig == 0 && c->f_class == CL_GPU) {
    char m[sizeof c->msg + 1];
    memcpy(m, c->msg, sizeof c->msg);
    m[sizeof c->msg] = 0;
    /* an access outside any allocation: the GPU's SIGSEGV */
    jb_set_fault(s, strstr(m, "ILLEGAL_ADDRESS") ? "out-of-bounds-access" : "crashed",
              "the GPU faulted under the kernel: %s", m);
    return;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_FAULT && c->fault && c->f_sig == 0 && c->f_class > 0 &&
      c->f_class <= CL_SYSCALL) {
    jb_set_fault(s, kClassCode[c->f_class], "the kernel called %.*s (detected)", (int)strnlen(c->f_name, sizeof c->f_name),
              c->f_name);
    return;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_FAULT && c->fault) {
    if (c->f_sig == SIGSYS && c->f_class > 0 && c->f_class <= CL_SYSCALL) {
      const char* nm = jb_syscall_name(c->f_nr);
      char num[32];
      snprintf(num, sizeof num, "syscall %d", c->f_nr);
      jb_set_fault(s, kClassCode[c->f_class], "the kernel called %s", nm ? nm : num);
      return;
    }
    const char* sn = sig_name(c->f_sig);
    if (c->f_sig == SIGSEGV || c->f_sig == SIGBUS) {
      char* a = (char*)(uintptr_t)c->f_addr;
      for (int i = 0; i < s->n_bufs; i++) {
        jbuf* b = &s->bufs[i];
        if (!b->map || a < b->map || a >= b->map + b->map_len) continue;
        char which[64];
        name_buffer(s, b, which, sizeof which);
        if (a < b->map + b->guard) {
          jb_set_fault(s, "out-of-bounds-access", "%s at %p: %zu bytes before the start of %s (a guard page)", sn, (void*)a,
                    (size_t)(b->map + b->data_off - a), which);
        } else if (a >= b->map + b->map_len - b->guard) {
          jb_set_fault(s, "out-of-bounds-access", "%s at %p: %zu bytes past the end of %s (a guard page)", sn, (void*)a,
                    (size_t)(a - (b->map + b->data_off + b->nbytes)), which);
        } else if (b->is_input) {
          jb_set_fault(s, "input-mutated", "a write to %s (read-only) at byte offset %lld", which,
                    (long long)(a - (b->map + b->data_off)));
        } else {
          jb_set_fault(s, "crashed", "%s at %p inside %s", sn, (void*)a, which);
        }
        return;
      }
      jb_set_fault(s, "crashed", "%s at address %p", sn, (void*)a);
      return;
    }
    if (c->f_sig == SIGSYS) {
      jb_set_fault(s, "forbidden-syscall", "SIGSYS (syscall %d)", c->f_nr);
      return;
    }
    jb_set_fault(s, "crashed", "%s at address %p", sn ? sn : "a signal", (void*)(uintptr_t)c->f_addr);
    return;
  }
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    if (sig == SIGSYS) { /* SECCOMP_RET_KILL_PROCESS: a kernel that went for SIGSYS's handler */
      if (s->cuda) /* (or, CUDA mode, a trapped call with SIGSYS blocked: rt_sigprocmask is not trapped there) */
        jb_set_fault(s, "forbidden-syscall", "killed by SIGSYS: a forbidden call made with SIGSYS blocked, or "
                  "rt_sigaction on SIGSYS (the sandbox's handler)");
      else
        jb_set_fault(s, "forbidden-syscall", "rt_sigaction (SIGSYS: the sandbox's handler)");
      return;
    }
    const char* sn = sig_name(sig);
    if (sn) jb_set_fault(s, "crashed", "the kernel process was killed by %s", sn);
    else jb_set_fault(s, "crashed", "the kernel process was killed by signal %d", sig);
    return;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_SETUP)
    jb_set_fault(s, "crashed", "the kernel process could not set itself up: %.*s", (int)strnlen(c->msg, sizeof c->msg),
              c->msg);
  else if (c->exit_called)
    jb_set_fault(s, "crashed", "the kernel called exit(%d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  else if (!s->seccomp_ok) /* no trap, no fault, no exit(): its image was replaced, most likely */
    jb_set_fault(s, "forbidden-exec", "the kernel process ended with status %d without exit() or a fault: another "
              "program replaced it, or it called _exit (detected)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  else
    jb_set_fault(s, "crashed", "the kernel process ended with status %d without exit(): it called _exit",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

int jb_reap(judge_state* s, int block) {
  if (s->child <= 0 || s->child_reaped) return s->child_reaped;
  int st;
  pid_t r;
  do r = waitpid(s->child, &st, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == s->child) {
    s->child_status = st;
    s->child_reaped = 1;
  }
  return s->child_reaped;
}

/* one round trip: 0, or -1 with the fault set (the child died) or err set */
int jb_call(judge_state* s, int cmd, char* err, size_t errlen) {
  ctl_page* c = s->ctl;
  if (s->child_reaped) {
    snprintf(err, errlen, "%s: %s", s->fault_code[0] ? s->fault_code : "crashed", s->fault_detail);
    return -1;
  }
  atomic_store_explicit(&c->cmd, cmd, memory_order_relaxed);
  uint32_t want = ++s->seq;
  int idle = atomic_load_explicit(&c->idle, memory_order_relaxed);
  atomic_store_explicit(&c->go, want, memory_order_release);
  if (idle) {
    atomic_store_explicit(&c->idle, 0, memory_order_relaxed);
    syscall(SYS_futex, &c->go, FUTEX_WAKE, 1, NULL, NULL, 0);
  }
  /* Spin for the first spin_ns (a short kernel's return is seen within ~100 ns), then sleep on
   * `done` until the child wakes us: a spinning timer would take a core from a kernel that uses
   * all of them (a 2-thread TVM kernel on 2 cores ran 12x slower against a spinning parent). The
   * sleep's wake-up latency is on the kernel's clock, but only for calls longer than spin_ns. */
  unsigned spins = 0;
  int64_t spin_until = s->spin_ns > 0 ? jb_mono_ns() + s->spin_ns : 0;
  int sleeping = 0;
  while (atomic_load_explicit(&c->done, memory_order_acquire) != want) {
    if (!sleeping) {
      cpu_relax();
      if ((++spins & 63) == 0 && jb_mono_ns() >= spin_until) sleeping = 1;
      else if ((spins & 4095) != 0) continue;
    }
    if (sleeping) {
      atomic_store_explicit(&c->parent_waiting, 1, memory_order_seq_cst);
      uint32_t seen = atomic_load_explicit(&c->done, memory_order_seq_cst);
      if (seen != want) {
        struct timespec ts = {0, 2000000}; /* 2 ms: look at the child and the deadline */
        syscall(SYS_futex, &c->done, FUTEX_WAIT, seen, &ts, NULL, 0);
      }
      atomic_store_explicit(&c->parent_waiting, 0, memory_order_relaxed);
      if (atomic_load_explicit(&c->done, memory_order_acquire) == want) break;
    }
    if (jb_reap(s, 0)) {
      jb_classify_death(s);
      snprintf(err, errlen, "%s: %s", s->fault_code, s->fault_detail);
      return -1;
    }
    if (s->deadline_ns && jb_mono_ns() > s->deadline_ns) {
      snprintf(err, errlen, "hung: the kernel did not return within the job's time limit");
      return -1;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------ detect mode (no seccomp) */

ssize_t jb_read_file(const char* path, char* buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = 0;
  for (;;) {
    ssize_t n = read(fd, buf + len, cap - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
    if (len + 1 >= cap) break;
  }
  close(fd);
  buf[len] = 0;
  return (ssize_t)len;
}

/* children's minor faults and cpu time: grow when a child was forked and waited for */
static int child_stat(pid_t pid, unsigned long long* cminflt, unsigned long long* ctime) {
  char path[64], buf[2048];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (jb_read_file(path, buf, sizeof buf) <= 0) return -1;
  char* p = strrchr(buf, ')');
  if (!p) return -1;
  p += 2; /* field 3: state */
  unsigned long long v[20] = {0};
  int f = 3;
  char* save = NULL;
  for (char* tok = strtok_r(p, " ", &save); tok && f <= 17; tok = strtok_r(NULL, " ", &save), f++)
    if (f >= 3 && f < 23) v[f - 3] = strtoull(tok, NULL, 10);
  *cminflt = v[11 - 3];
  *ctime = v[16 - 3] + v[17 - 3];
  return 0;
}

static int fd_for_write(pid_t pid, int fd) {
  char path[96], buf[512];
  snprintf(path, sizeof path, "/proc/%d/fdinfo/%d", (int)pid, fd);
  if (jb_read_file(path, buf, sizeof buf) <= 0) return 0;
  char* fl = strstr(buf, "flags:");
  if (!fl) return 0;
  unsigned long flags = strtoul(fl + 6, NULL, 8);
  return (flags & (O_WRONLY | O_RDWR)) != 0;
}

void jb_detect_baseline(judge_state* s) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)s->child);
  ssize_t n = jb_read_file(path, s->cmdline0, sizeof s->cmdline0);
  s->cmdline0_len = n > 0 ? (size_t)n : 0;
  child_stat(s->child, &s->cminflt0, &s->cutime0);
  snprintf(path, sizeof path, "/proc/%d/fd", (int)s->child);
  DIR* d = opendir(path);
  struct dirent* e;
  s->n_wfd0 = 0;
  while (d && (e = readdir(d)) != NULL)
    if (e->d_name[0] != '.' && s->n_wfd0 < 256 && fd_for_write(s->child, atoi(e->d_name)))
      s->wfd0[s->n_wfd0++] = atoi(e->d_name);
  if (d) closedir(d);
}

void jb_detect(judge_state* s) {
  pid_t pid = s->child;
  char path[96], buf[1024];
  /* a process of its own: live children, or dead ones it waited for */
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR* d = opendir(path);
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char p2[160];
    snprintf(p2, sizeof p2, "/proc/%d/task/%s/children", (int)pid, e->d_name);
    if (jb_read_file(p2, buf, sizeof buf) > 0 && buf[0] && buf[0] != '\n') {
      closedir(d);
      jb_set_fault(s, "forbidden-process", "the kernel started a process (pid %d; detected)", atoi(buf));
      return;
    }
  }
  if (d) closedir(d);
  unsigned long long cminflt, ctime;
  if (child_stat(pid, &cminflt, &ctime) == 0 && (cminflt != s->cminflt0 || ctime != s->cutime0)) {
    jb_set_fault(s, "forbidden-process", "the kernel started a process and waited for it (detected)");
    return;
  }
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  ssize_t n = jb_read_file(path, buf, sizeof buf);
  if (n >= 0 && ((size_t)n != s->cmdline0_len || memcmp(buf, s->cmdline0, (size_t)n))) {
    jb_set_fault(s, "forbidden-exec", "the kernel process runs another program (detected)");
    return;
  }
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  d = opendir(path);
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    int fd = atoi(e->d_name);
    char p2[160], link[256];
    snprintf(p2, sizeof p2, "/proc/%d/fd/%d", (int)pid, fd);
    ssize_t ln = readlink(p2, link, sizeof link - 1);
    if (ln <= 0) continue;
    link[ln] = 0;
    if (!strncmp(link, "socket:[", 8)) {
      closedir(d);
      jb_set_fault(s, "forbidden-network", "the kernel holds a socket (fd %d; detected)", fd);
      return;
    }
    if (fd_for_write(pid, fd)) {
      int known = 0;
      for (int i = 0; i < s->n_wfd0; i++) known |= s->wfd0[i] == fd;
      if (!known) {
        closedir(d);
        jb_set_fault(s, "forbidden-file", "the kernel opened %s for writing (detected)", link);
        return;
      }
    }
  }
  if (d) closedir(d);
}
