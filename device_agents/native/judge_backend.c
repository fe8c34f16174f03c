/* Backend "judge": third-party kernels (untrusted C/C++) run in a sandboxed KERNEL CHILD; the worker
 * (the run loop in agent.c) stays the TIMER and a handshake over a shared control page is what
 * be->run() costs on top of the kernel (PROTOCOL.md "The judge backend").
 *
 *   abi "edgetune": int edgetune_kernel(const DLTensor* in, int32_t n_in, DLTensor* out, int32_t n_out)
 *   abi "tvm":      __tvm_ffi_main, called as the tvm-kernel backend calls it (agent thread pool in the child)
 *
 * Buffers live in memfds shared by both processes: [guard][pad | data | slack][guard]; the child maps
 * the guards PROT_NONE, the inputs read-only (sealed F_SEAL_FUTURE_WRITE), the outputs read-write.
 * The child runs under a seccomp-BPF filter (two stages) or, where the kernel or emulator refuses
 * seccomp (qemu-user), is inspected from /proc between runs ("detect").
 *
 * params.device "cuda" (a CUDA kernel, built with nvcc): the child opens the GPU through the driver
 * API (judge_cuda.c) before its sandbox and holds a guarded device copy of every buffer; the
 * DLTensors the kernel gets are kDLCUDA. Each run is three round trips: PRE (inputs uploaded,
 * outputs poisoned on the device, L2 overwritten, synchronized), RUN (the kernel call and
 * cuCtxSynchronize: all its work on every stream of the context, launches included) and POST
 * (outputs downloaded into the shared buffers the agent verifies). The worker's sample is RUN's
 * round trip, measured here in the parent (timed_ns hook): nothing the kernel's process reports is
 * a time. The CUDA events around the call are kept as information only.
 *
 * The files:
 *   judge_internal.h  the constants, the control page, the job's state (judge_state), the shared prototypes
 *   judge_seccomp.c   syscall names, the seccomp-BPF filter (two stages), installing it, judge_seccomp_probe
 *   judge_elf.c       the artifact's ELF check (its exports, interposed symbols)
 *   judge_buffers.c   the job's state (one per process) and the shared buffers (the alloc hook)
 *   judge_child.c     the kernel child: setup, sandbox, signal-mask emulation, fault handler, serve loop
 *   judge_faults.c    the parent's side: fault records, the child's death classified, the round trip,
 *                     detect mode
 *   judge_backend.c   (this file) load, bind, run, check and the backend's tables */
#include "judge_internal.h"

/* ------------------------------------------------------------------ the backend */

static int judge_load(backend* b, const backend_config* cfg, char* err, size_t errlen) {
  judge_state* s = jb_state_of(b);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  const char* abi = param_str(cfg->params, "abi");
  if (abi && strcmp(abi, "edgetune") && strcmp(abi, "tvm")) {
    snprintf(err, errlen, "params.abi must be \"edgetune\" or \"tvm\", not \"%s\"", abi);
    return -1;
  }
  s->abi_tvm = abi && !strcmp(abi, "tvm");
  const char* entry = param_str(cfg->params, "entry");
  snprintf(s->entry, sizeof s->entry, "%s", entry ? entry : s->abi_tvm ? "__tvm_ffi_main" : "edgetune_kernel");
  long long nt;
  s->nthreads = param_int(cfg->params, "num_threads", &nt) == 0 && nt > 0 ? (int)(nt > 1024 ? 1024 : nt) : cpu_count();
  long long spin_us = -1;
  s->spin_fixed = param_int(cfg->params, "spin_us", &spin_us) == 0 && spin_us >= 0;
  s->spin_ns = s->spin_fixed ? spin_us * 1000 : JUDGE_SPIN_NS;
  s->timeout_s = cfg->timeout_s;
  if (s->timeout_s > 0) s->deadline_ns = jb_mono_ns() + (int64_t)((s->timeout_s + 1.0) * 1e9);
  if (realpath(cfg->artifact, s->artifact) == NULL) snprintf(s->artifact, sizeof s->artifact, "%s", cfg->artifact);
#ifdef ET_STATIC
  snprintf(err, errlen, "the judge backend needs a dynamic agent (dlopen)");
  return -1;
#endif
  s->seccomp_ok = judge_seccomp_probe(s->seccomp_why, sizeof s->seccomp_why) == 0;
  const char* device = param_str(cfg->params, "device");
  if (device && strcmp(device, "cpu") && strcmp(device, "cuda")) {
    snprintf(err, errlen, "params.device must be \"cpu\" or \"cuda\", not \"%s\"", device);
    return -1;
  }
  s->cuda = device && !strcmp(device, "cuda");
  s->last_ns = -1;
  if (s->cuda) {
    if (s->abi_tvm) {
      snprintf(err, errlen, "params.device \"cuda\" takes abi \"edgetune\" kernels");
      return -1;
    }
    const char* drv = param_str(cfg->params, "cuda_driver"); /* tests: a stand-in driver */
    snprintf(s->cuda_driver, sizeof s->cuda_driver, "%s", drv ? drv : "libcuda.so.1");
    long long ord = 0;
    s->cuda_ordinal = param_int(cfg->params, "cuda_device", &ord) == 0 && ord >= 0 && ord < 64 ? (int)ord : 0;
    /* the kernel runs on the GPU, not on cores the timer would take: with 4 cores or more the timer
     * spins through a whole call (a sleeping timer's wake-up would be on the kernel's clock), with 2-3
     * for 1 ms, with 1 never */
    if (!s->spin_fixed) {
      s->spin_fixed = 1;
      s->spin_ns = cpu_count() >= 4 ? JUDGE_SPIN_CUDA_NS : cpu_count() > 1 ? JUDGE_SPIN_FREE_CORE_NS : 0;
    }
  }
  if (jb_check_elf(s, s->artifact, err, errlen)) return -1;
  if (!s->bound) {
    snprintf(err, errlen, "judge: buffers not bound before load");
    return -1;
  }
  s->ctl = (ctl_page*)mmap(NULL, sizeof(ctl_page) < jb_page_size() ? jb_page_size() : sizeof(ctl_page),
                           PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s->ctl == MAP_FAILED) {
    s->ctl = NULL;
    snprintf(err, errlen, "mmap: %s", strerror(errno));
    return -1;
  }
  memset(s->ctl, 0, sizeof *s->ctl);
  /* inputs: no writable mapping can be made from here on (the child's view is read-only for good) */
  /* (an older kernel has no F_SEAL_FUTURE_WRITE: the child could mprotect its view writable, which
   * the input hashes after every checked run still catch: backend_info.inputs_sealed says which) */
  s->sealed = 1;
  for (int i = 0; i < s->n_bufs; i++)
    if (s->bufs[i].is_input && fcntl(s->bufs[i].fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)) s->sealed = 0;
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* the child cannot read our memory through /proc */
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(err, errlen, "fork: %s", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    jb_child_main(s, parent);
    _exit(EXIT_SETUP);
  }
  s->child = pid;
  /* the handshake alone, with the trusted no-op */
  long long rt[HANDSHAKE_ROUNDS];
  for (int i = 0; i < HANDSHAKE_ROUNDS; i++) {
    int64_t a = jb_mono_ns();
    if (jb_call(s, CMD_NOOP, err, errlen)) return -1;
    rt[i] = jb_mono_ns() - a;
  }
  for (int i = 1; i < HANDSHAKE_ROUNDS; i++) /* insertion sort: 200 values */
    for (int j = i; j > 0 && rt[j - 1] > rt[j]; j--) {
      long long t = rt[j];
      rt[j] = rt[j - 1];
      rt[j - 1] = t;
    }
  s->handshake_ns = rt[HANDSHAKE_ROUNDS / 2];
  if (jb_call(s, CMD_LOAD, err, errlen)) return -1;
  if (s->ctl->rc) {
    char m[sizeof s->ctl->msg + 1]; /* the page is the kernel's to write too: bounded, terminated */
    memcpy(m, s->ctl->msg, sizeof s->ctl->msg);
    m[sizeof s->ctl->msg] = 0;
    if (!strncmp(m, "bad-artifact: ", 14)) jb_set_fault(s, "bad-artifact", "%s", m + 14);
    snprintf(err, errlen, "%s", m); /* (cuda-unavailable: the device's, not the kernel's: no fault) */
    return -1;
  }
  if (!s->seccomp_ok) jb_detect_baseline(s);
  return 0;
}

static int judge_bind(backend* b, et_tensor* in, et_tensor* out, char* err, size_t errlen) {
  judge_state* s = jb_state_of(b);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (s->child > 0) {
    snprintf(err, errlen, "the judge backend binds one set of buffers, before load");
    return -1;
  }
  s->n_in = s->n_out = 0;
  /* in/out arrays end where tensors stop being ours: the agent passes n_in/n_out via the config at
   * load; here every buffer allocated through the hook is matched by address */
  for (int i = 0; i < s->n_bufs; i++) s->bufs[i].index = -1;
  for (int pass = 0; pass < 2; pass++) {
    et_tensor* ts = pass ? out : in;
    for (int k = 0;; k++) {
      int found = -1;
      for (int i = 0; i < s->n_bufs; i++)
        if (s->bufs[i].t == &ts[k] && s->bufs[i].is_input == !pass) found = i;
      if (found < 0) break;
      if (pass) s->out_idx[s->n_out++] = found;
      else s->in_idx[s->n_in++] = found;
      s->bufs[found].index = k;
    }
  }
  s->bound = 1;
  return 0;
}

/* a CUDA step that is not the kernel's call (PRE, POST): 0, or -1 with err */
static int cuda_step(judge_state* s, int cmd, char* err, size_t errlen) {
  if (jb_call(s, cmd, err, errlen)) return -1;
  if (s->ctl->rc) {
    char m[sizeof s->ctl->msg + 1];
    memcpy(m, s->ctl->msg, sizeof s->ctl->msg);
    m[sizeof s->ctl->msg] = 0;
    snprintf(err, errlen, "%s", m);
    return -1;
  }
  return 0;
}

static int judge_run(backend* b, char* err, size_t errlen) {
  judge_state* s = (judge_state*)b->state;
  if (s->cuda && cuda_step(s, CMD_CUDA_PRE, err, errlen)) return -1;
  int64_t a = jb_mono_ns();
  if (jb_call(s, CMD_RUN, err, errlen)) return -1;
  s->last_ns = s->cuda ? jb_mono_ns() - a : -1;
  int rc = s->ctl->rc;
  if (rc) {
    jb_set_fault(s, "kernel-error", "%s returned %d", s->entry, rc);
    snprintf(err, errlen, "%s: %s", s->fault_code, s->fault_detail);
    return -1;
  }
  if (s->cuda) {
    if (s->ctl->event_ns >= 0) {
      s->event_sum_ns += (double)s->ctl->event_ns;
      s->event_n++;
    }
    if (cuda_step(s, CMD_CUDA_POST, err, errlen)) return -1;
  }
  return 0;
}

static int64_t judge_timed_ns(backend* b) {
  judge_state* s = (judge_state*)b->state;
  return s && s->cuda ? s->last_ns : -1;
}

/* threads of the kernel's child now (field 20 of /proc/<pid>/stat), or -1 */
static long child_threads(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (jb_read_file(path, buf, sizeof buf) <= 0) return -1;
  char* p = strrchr(buf, ')');
  if (!p) return -1;
  int field = 2;
  for (; *p && field < 20; p++)
    if (*p == ' ') field++;
  return strtol(p, NULL, 10);
}

/* The timer spins on a call's return only while the kernel leaves it a core (its threads fewer
 * than the CPUs): there spinning is free and sees the return within ~100 ns. A kernel that uses
 * every core would lose one to a spinning timer (12x slower for a 2-thread TVM GEMM on 2 cores,
 * tools/bench/bench_judge_harness.py), so there the timer sleeps and the child wakes it. Looked
 * at outside the timed region, each time the agent checks the guards (thread pools start late). */
static void adapt_spin(judge_state* s) {
  if (s->spin_fixed || s->child_reaped) return;
  long t = child_threads(s->child);
  if (t > 0) s->spin_ns = t < cpu_count() ? JUDGE_SPIN_FREE_CORE_NS : 0;
}

static int judge_check(backend* b, char* err, size_t errlen) {
  judge_state* s = (judge_state*)b->state;
  if (!s || s->child <= 0) return 0;
  adapt_spin(s);
  if (!s->fault_code[0] && jb_reap(s, 0)) jb_classify_death(s);
  if (!s->fault_code[0] && !s->seccomp_ok && !s->child_reaped) jb_detect(s);
  if (!s->fault_code[0] && s->cuda && !s->child_reaped && s->ctl && s->ctl->rc == 0) {
    char e[512];
    if (jb_call(s, CMD_CUDA_CHECK, e, sizeof e) == 0 && s->ctl->rc) {
      char m[sizeof s->ctl->msg + 1];
      memcpy(m, s->ctl->msg, sizeof s->ctl->msg);
      m[sizeof s->ctl->msg] = 0;
      char* sep = strstr(m, ": ");
      if (s->ctl->rc == 1 && sep && (!strncmp(m, "out-of-bounds-write", 19) || !strncmp(m, "input-mutated", 13))) {
        *sep = 0;
        jb_set_fault(s, m, "%s", sep + 2);
      } else {
        snprintf(err, errlen, "%s", m);
        return -1;
      }
    } else if (!s->fault_code[0] && s->child_reaped) {
      snprintf(err, errlen, "%s", e);
      return -1;
    }
  }
  if (s->fault_code[0]) {
    snprintf(err, errlen, "%s: %s", s->fault_code, s->fault_detail);
    return -1;
  }
  return 0;
}

static void judge_idle(backend* b) {
  judge_state* s = (judge_state*)b->state;
  if (s && s->ctl) atomic_store_explicit(&s->ctl->idle, 1, memory_order_relaxed);
}

static void judge_unload(backend* b) {
  judge_state* s = (judge_state*)b->state;
  if (!s) return;
  if (s->child > 0 && !s->child_reaped) {
    kill(s->child, SIGKILL);
    jb_reap(s, 1);
  }
}

static void judge_versions(backend* b, sbuf* out) {
  (void)b;
  sb_raw(out, "\"judge\":\"1\"");
}

static void judge_details(backend* b, sbuf* out) {
  judge_state* s = (judge_state*)b->state;
  if (!s) return;
  char sandbox[200];
  if (s->seccomp_ok) snprintf(sandbox, sizeof sandbox, "seccomp");
  else snprintf(sandbox, sizeof sandbox, "detect (seccomp unavailable: %s)", s->seccomp_why);
  sb_printf(out, "\"abi\":\"%s\",\"entry\":", s->abi_tvm ? "tvm" : "edgetune");
  sb_str(out, s->entry);
  sb_raw(out, ",\"sandbox\":");
  sb_str(out, sandbox);
  sb_printf(out, ",\"spin_ns\":%lld,\"handshake_ns\":%lld,\"threads\":%d,\"inputs_sealed\":%s", s->spin_ns, s->handshake_ns,
            s->abi_tvm ? s->nthreads : 0, s->sealed ? "true" : "false");
  if (s->cuda) { /* the samples: RUN's round trip (call + cuCtxSynchronize), timed here */
    sb_printf(out, ",\"device\":\"cuda\",\"cuda_device\":%d,\"timing\":\"host: call + cuCtxSynchronize\","
              "\"cuda_event_mean_ns\":", s->cuda_ordinal);
    if (s->event_n) sb_printf(out, "%.0f", s->event_sum_ns / (double)s->event_n);
    else sb_raw(out, "null");
  }
}

static int judge_fault(backend* b, char* code, size_t codelen, char* detail, size_t detaillen) {
  judge_state* s = (judge_state*)b->state;
  if (!s || !s->fault_code[0]) return 0;
  snprintf(code, codelen, "%s", s->fault_code);
  snprintf(detail, detaillen, "%s", s->fault_detail);
  return 1;
}

backend* backend_judge(void) {
  static backend b = {"judge", judge_load, judge_bind, judge_run, judge_unload, judge_versions, judge_details, NULL};
  return &b;
}

const backend_hooks* backend_hooks_of(const backend* b) {
  static const backend_hooks judge = {judge_alloc, judge_check, judge_idle, judge_fault, judge_timed_ns};
  return b == backend_judge() ? &judge : NULL;
}
