/* The judge's kernel child: its setup (mappings, descriptors, GPU, handlers, limits, seccomp) and its serve loop. */
#include "judge_internal.h"

/* ------------------------------------------------------------------ the kernel child */

static ctl_page* g_ctl;
static void* g_fn;
static int g_abi_tvm;
static DLTensor* g_dl;
static TVMFFIAny* g_args;
static int g_nin, g_nout;
static jcuda g_cu;             /* params.device "cuda" */
static int g_dev[MAX_BUFS];    /* bind order (inputs, then outputs) -> device buffer */
static char g_cuda_err[400];   /* the GPU could not be opened: LOAD answers with it */

#define SIGBIT(n) (1ull << ((n) - 1))
#define KEEP_UNBLOCKED (SIGBIT(SIGSYS) | SIGBIT(SIGSEGV) | SIGBIT(SIGBUS) | SIGBIT(SIGILL) | SIGBIT(SIGFPE))

/* rt_sigprocmask(how, set, oldset, size) trapped: done on the frame's saved mask, which sigreturn
 * installs; 1 when it was that */
static int emulate_sigmask(siginfo_t* si, void* ucv) {
#if defined(__x86_64__) || defined(__aarch64__)
  if (si->si_code != SYS_SECCOMP || si->si_errno != CL_SIGMASK) return 0;
  ucontext_t* uc = (ucontext_t*)ucv;
#if defined(__x86_64__)
  long long* regs = (long long*)uc->uc_mcontext.gregs;
  unsigned long long a0 = (unsigned long long)regs[REG_RDI], a1 = (unsigned long long)regs[REG_RSI],
                     a2 = (unsigned long long)regs[REG_RDX], a3 = (unsigned long long)regs[REG_R10];
#else
  unsigned long long a0 = uc->uc_mcontext.regs[0], a1 = uc->uc_mcontext.regs[1], a2 = uc->uc_mcontext.regs[2],
                     a3 = uc->uc_mcontext.regs[3];
#endif
  long ret = 0;
  uint64_t cur;
  memcpy(&cur, &uc->uc_sigmask, sizeof cur);
  if (a3 != 8) {
    ret = -EINVAL;
  } else {
    uint64_t set = 0;
    if (a1) memcpy(&set, (const void*)(uintptr_t)a1, 8);
    uint64_t nw = cur;
    if (a1) {
      if (a0 == SIG_BLOCK) nw = cur | set;
      else if (a0 == SIG_UNBLOCK) nw = cur & ~set;
      else if (a0 == SIG_SETMASK) nw = set;
      else ret = -EINVAL;
    }
    if (!ret) {
      if (a2) memcpy((void*)(uintptr_t)a2, &cur, 8);
      nw &= ~(KEEP_UNBLOCKED | SIGBIT(SIGKILL) | SIGBIT(SIGSTOP));
      memcpy(&uc->uc_sigmask, &nw, sizeof nw);
    }
  }
#if defined(__x86_64__)
  regs[REG_RAX] = ret;
#else
  uc->uc_mcontext.regs[0] = (unsigned long long)ret;
#endif
  return 1;
#else
  (void)si;
  (void)ucv;
  return 0;
#endif
}

static void on_fault(int sig, siginfo_t* si, void* uc) {
  if (sig == SIGSYS && emulate_sigmask(si, uc)) return;
  ctl_page* c = g_ctl;
  c->f_sig = sig;
  c->f_code = si->si_code;
  c->f_addr = (uint64_t)(uintptr_t)si->si_addr;
  c->f_nr = -1;
  c->f_class = CL_NONE;
#ifdef SYS_SECCOMP
  if (sig == SIGSYS && si->si_code == SYS_SECCOMP) {
    c->f_nr = si->si_syscall;
    c->f_class = si->si_errno; /* SECCOMP_RET_DATA */
  }
#endif
  __atomic_store_n(&c->fault, 1, __ATOMIC_SEQ_CST);
  syscall(SYS_exit_group, EXIT_FAULT);
}

DLDataType et_dl_dtype(et_dtype t); /* tvm_backend.c */

extern volatile int g_judge_guard; /* judge_guard.c */

/* a libc guard saw a forbidden call (detect mode): a fault record, as the seccomp trap writes */
void judge_guard_trip(int cls, const char* name) {
  ctl_page* c = g_ctl;
  if (c) {
    c->f_sig = 0;
    c->f_class = cls;
    c->f_nr = -1;
    snprintf(c->f_name, sizeof c->f_name, "%s", name);
    __atomic_store_n(&c->fault, 1, __ATOMIC_SEQ_CST);
  }
  syscall(SYS_exit_group, EXIT_FAULT);
}

static void on_exit_record(void) {
  if (g_ctl) g_ctl->exit_called = 1;
}

static void child_fail(ctl_page* c, const char* what) {
  snprintf(c->msg, sizeof c->msg, "%s: %s", what, strerror(errno));
  _exit(EXIT_SETUP);
}

static int child_load(judge_state* s) {
  ctl_page* c = s->ctl;
  void* dl = dlopen(s->artifact, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* why = dlerror();
    snprintf(c->msg, sizeof c->msg, "bad-artifact: dlopen failed: %s", why ? why : "unknown error");
    return -1;
  }
  if (s->abi_tvm) {
    static const et_tvm_slot slots[] = {ET_TVM_SLOTS};
    for (size_t i = 0; i < sizeof slots / sizeof *slots; i++) {
      void** slot = (void**)dlsym(dl, slots[i].name);
      if (slot) *slot = slots[i].fn;
    }
  }
  g_fn = dlsym(dl, s->entry);
  if (!g_fn) {
    snprintf(c->msg, sizeof c->msg, "bad-artifact: no symbol '%s'", s->entry);
    return -1;
  }
  if (s->abi_tvm) {
    char err[256];
    if (et_pool_start(s->nthreads, err, sizeof err)) {
      snprintf(c->msg, sizeof c->msg, "thread pool: %s", err);
      return -1;
    }
  }
  return 0;
}

/* PRE: inputs up, outputs poisoned, L2 overwritten; POST: outputs down; CHECK: device guards and
 * inputs. 0, 1 with "code: detail" in msg (CHECK found the kernel breaking a rule), -1 with msg. */
static int child_cuda(judge_state* s, ctl_page* c, int cmd) {
  char err[300];
  err[0] = 0;
  int n = s->n_in + s->n_out;
  for (int k = 0; k < n; k++) {
    jbuf* b = &s->bufs[k < s->n_in ? s->in_idx[k] : s->out_idx[k - s->n_in]];
    char* host = b->map + b->data_off;
    int in = k < s->n_in, idx = in ? k : k - s->n_in;
    if (cmd == CMD_CUDA_PRE) {
      if (in ? jc_upload(&g_cu, g_dev[k], host, err, sizeof err) : jc_poison(&g_cu, g_dev[k], err, sizeof err)) break;
    } else if (cmd == CMD_CUDA_POST) {
      if (!in && jc_download(&g_cu, g_dev[k], host, err, sizeof err)) break;
    } else {
      int after = 0;
      size_t off = 0;
      int g = jc_guards(&g_cu, g_dev[k], &after, &off, err, sizeof err);
      if (g < 0) break;
      if (g > 0) {
        snprintf(c->msg, sizeof c->msg, "out-of-bounds-write: a write %zu bytes %s %s %d (its guard zone in GPU memory)",
                 off, after ? "past the end of" : "before the start of", in ? "input" : "output", idx);
        return 1;
      }
      if (in) {
        g = jc_compare(&g_cu, g_dev[k], host, &off, err, sizeof err);
        if (g < 0) break;
        if (g > 0) {
          snprintf(c->msg, sizeof c->msg, "input-mutated: input %d in GPU memory differs from what was uploaded "
                   "at byte offset %zu", idx, off);
          return 1;
        }
      }
    }
  }
  if (!err[0] && cmd == CMD_CUDA_PRE) jc_flush_l2(&g_cu, err, sizeof err);
  if (!err[0] && cmd == CMD_CUDA_PRE) {
    char name[128];
    if (jc_sync(&g_cu, name, sizeof name)) snprintf(err, sizeof err, "cuCtxSynchronize: %s", name);
  }
  if (err[0]) {
    snprintf(c->msg, sizeof c->msg, "cuda: %s", err);
    return -1;
  }
  return 0;
}

void jb_child_main(judge_state* s, pid_t parent) {
  ctl_page* c = s->ctl;
  g_ctl = c;
  /* 0. our own views of the buffers at the parent's addresses; the parent's writable ones go */
  for (int i = 0; i < s->n_bufs; i++) {
    jbuf* b = &s->bufs[i];
    if (munmap(b->map, b->map_len)) child_fail(c, "munmap");
    if (mmap(b->map, b->map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
      child_fail(c, "mmap guard");
    size_t body = b->map_len - 2 * b->guard;
    if (mmap(b->map + b->guard, body, b->is_input ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, b->fd,
             (off_t)b->guard) == MAP_FAILED)
      child_fail(c, "mmap buffer");
  }
  /* 1. no descriptor but 0, 1, 2 (the memfds included) */
  int keep_qemu = !s->seccomp_ok; /* under qemu-user the emulator's own descriptors are in the table */
  DIR* d = opendir("/proc/self/fd");
  int fds[512], nfd = 0;
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL && nfd < 512) {
    int fd = atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(d)) continue;
    int ours = 0;
    for (int i = 0; i < s->n_bufs; i++) ours |= s->bufs[i].fd == fd;
    struct stat st;
    if (keep_qemu && !ours && !fstat(fd, &st) && S_ISREG(st.st_mode)) continue;
    fds[nfd++] = fd;
  }
  if (d) closedir(d);
  for (int i = 0; i < nfd; i++) close(fds[i]);
  /* 2. dies with the worker; the parent reads our /proc (we inherited its non-dumpable flag) */
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != parent) _exit(EXIT_SETUP);
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  /* 2b. the GPU, before any limit or filter: the driver opens /dev/nvidia* read-write and starts its
   *     threads here; the kernel's code is not loaded yet */
  if (s->cuda) {
    char err[300];
    int ok = jc_open(&g_cu, s->cuda_driver, s->cuda_ordinal, err, sizeof err) == 0;
    for (int k = 0; ok && k < s->n_in + s->n_out; k++) {
      jbuf* b = &s->bufs[k < s->n_in ? s->in_idx[k] : s->out_idx[k - s->n_in]];
      ok = (g_dev[k] = jc_alloc(&g_cu, b->nbytes, err, sizeof err)) >= 0;
    }
    if (!ok) snprintf(g_cuda_err, sizeof g_cuda_err, "%s", err);
  }
  /* 3. fault handlers (on an alternate stack: a stack overflow is named too) */
  static char altstack[65536];
  stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigfillset(&sa.sa_mask);
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS};
  sigset_t unblock;
  sigemptyset(&unblock);
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    sigaction(sigs[i], &sa, NULL);
    sigaddset(&unblock, sigs[i]);
  }
  sigprocmask(SIG_UNBLOCK, &unblock, NULL);
  atexit(on_exit_record);
  /* 4. rlimits */
  if (s->timeout_s > 0) {
    double cpu = s->timeout_s * cpu_count();
    rlim_t lim = (rlim_t)cpu + ((double)(rlim_t)cpu < cpu ? 1 : 0) + 1;
    struct rlimit rl = {lim, lim};
    setrlimit(RLIMIT_CPU, &rl);
  }
  struct rlimit core = {0, 0}, nofile = {64, 64};
  setrlimit(RLIMIT_CORE, &core);
  setrlimit(RLIMIT_NOFILE, &nofile);
  /* 5. seccomp stage 1 */
  bpf_prog* prog = (bpf_prog*)malloc(sizeof(bpf_prog));
  if (!prog) _exit(EXIT_SETUP);
  pid_t me = getpid();
  if (s->seccomp_ok) {
    jb_build_filter(prog, 0, me, s->cuda);
    /* CUDA: the driver's threads exist already; the filter is synchronized to them (TSYNC) */
    if (jb_install_filter(prog, s->cuda)) child_fail(c, "seccomp");
  }
  /* serve: NOOP (handshake measurement), LOAD, RUN, EXIT */
  uint32_t last = 0;
  for (;;) {
    uint32_t g;
    unsigned spins = 0;
    while ((g = atomic_load_explicit(&c->go, memory_order_acquire)) == last) {
      cpu_relax();
      if ((++spins & 255) == 0) {
        if (atomic_load_explicit(&c->idle, memory_order_relaxed))
          syscall(SYS_futex, &c->go, FUTEX_WAIT, last, NULL, NULL, 0);
        else
          sched_yield(); /* the parent may share this core */
      }
    }
    last = g;
    int cmd = atomic_load_explicit(&c->cmd, memory_order_relaxed);
    int rc = 0;
    if (cmd == CMD_EXIT) _exit(0);
    if (cmd == CMD_LOAD && g_cuda_err[0]) {
      snprintf(c->msg, sizeof c->msg, "cuda-unavailable: %s", g_cuda_err);
      rc = -1;
    } else if (cmd == CMD_LOAD) {
      if (!s->seccomp_ok) g_judge_guard = 1; /* from the kernel's constructors on */
      rc = child_load(s);
      if (rc == 0) {
        g_abi_tvm = s->abi_tvm;
        g_nin = s->n_in;
        g_nout = s->n_out;
        g_dl = (DLTensor*)calloc((size_t)(g_nin + g_nout) + 1, sizeof(DLTensor));
        g_args = (TVMFFIAny*)calloc((size_t)(g_nin + g_nout) + 1, sizeof(TVMFFIAny));
        if (!g_dl || !g_args) _exit(EXIT_SETUP);
        for (int k = 0; k < g_nin + g_nout; k++) {
          jbuf* b = &s->bufs[k < g_nin ? s->in_idx[k] : s->out_idx[k - g_nin]];
          et_tensor* t = b->t;
          DLTensor* dt = &g_dl[k];
          dt->data = b->map + b->data_off;
          dt->device.device_type = kDLCPU;
          if (s->cuda) {
            dt->data = (void*)(uintptr_t)jc_data(&g_cu, g_dev[k]);
            dt->device.device_type = kDLCUDA;
            dt->device.device_id = s->cuda_ordinal;
          }
          dt->ndim = t->ndim;
          dt->dtype = et_dl_dtype(t->dtype);
          dt->shape = (int64_t*)malloc(sizeof(int64_t) * (size_t)(t->ndim + 1));
          if (!dt->shape) _exit(EXIT_SETUP);
          memcpy(dt->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
          dt->strides = NULL;
          dt->byte_offset = 0;
          g_args[k].type_index = kTVMFFIDLTensorPtr;
          g_args[k].v_ptr = dt;
        }
        /* stage 2: no file opened any more at all (CUDA: stage 1 stays, read-only opens allowed: the
         * driver's threads may still read /proc and /sys) */
        if (s->seccomp_ok && !s->cuda) {
          jb_build_filter(prog, 1, me, 0);
          if (jb_install_filter(prog, 0)) {
            snprintf(c->msg, sizeof c->msg, "seccomp stage 2: %s", strerror(errno));
            rc = -1;
          }
        }
      }
    } else if (cmd == CMD_CUDA_PRE || cmd == CMD_CUDA_POST || cmd == CMD_CUDA_CHECK) {
      rc = child_cuda(s, c, cmd);
    } else if (cmd == CMD_RUN && s->cuda) {
      char name[128];
      jc_record(&g_cu, 0);
      rc = ((int (*)(const DLTensor*, int32_t, DLTensor*, int32_t))g_fn)(g_dl, g_nin, g_dl + g_nin, g_nout);
      jc_record(&g_cu, 1);
      if (jc_sync(&g_cu, name, sizeof name)) { /* the context is lost: a fault record, as a trap writes */
        snprintf(c->msg, sizeof c->msg, "%s", name);
        c->f_sig = 0;
        c->f_class = CL_GPU;
        c->f_nr = -1;
        __atomic_store_n(&c->fault, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_exit_group, EXIT_FAULT);
      }
      double ev = jc_elapsed_ns(&g_cu);
      c->event_ns = ev >= 0 ? (int64_t)ev : -1;
    } else if (cmd == CMD_RUN) {
      if (g_abi_tvm) {
        TVMFFIAny ret;
        memset(&ret, 0, sizeof ret);
        rc = ((TVMFFISafeCallType)g_fn)(NULL, g_args, g_nin + g_nout, &ret);
      } else {
        rc = ((int (*)(const DLTensor*, int32_t, DLTensor*, int32_t))g_fn)(g_dl, g_nin, g_dl + g_nin, g_nout);
      }
    }
    c->rc = rc;
    atomic_store_explicit(&c->done, g, memory_order_seq_cst);
    if (atomic_load_explicit(&c->parent_waiting, memory_order_seq_cst))
      syscall(SYS_futex, &c->done, FUTEX_WAKE, 1, NULL, NULL, 0);
  }
}
