/* The judge backend's internals, shared by its files (judge_backend.c lists them): the includes,
 * the constants, the control page, the job's state and the functions used across files. */
#ifndef EDGETUNE_JUDGE_INTERNAL_H_
#define EDGETUNE_JUDGE_INTERNAL_H_

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "judge_cuda.h"
#include "tvm_abi.h"

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef SECCOMP_RET_KILL_PROCESS
#define SECCOMP_RET_KILL_PROCESS 0x80000000U
#endif
#ifndef SYS_SECCOMP
#define SYS_SECCOMP 1
#endif

#if defined(__x86_64__)
#define ET_AUDIT_ARCH AUDIT_ARCH_X86_64
#define ET_EM EM_X86_64
#define cpu_relax() __asm__ __volatile__("pause" ::: "memory")
#elif defined(__aarch64__)
#define ET_AUDIT_ARCH AUDIT_ARCH_AARCH64
#define ET_EM EM_AARCH64
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define ET_AUDIT_ARCH 0
#define ET_EM 0
#define cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif

#define EXIT_FAULT 97   /* the child wrote a fault record, then exited */
#define EXIT_SETUP 98   /* the child could not set itself up */
#define MAX_BUFS 256
#define HANDSHAKE_ROUNDS 200

enum { CMD_NOOP = 0, CMD_LOAD = 1, CMD_RUN = 2, CMD_EXIT = 3, CMD_CUDA_PRE = 4, CMD_CUDA_POST = 5, CMD_CUDA_CHECK = 6 };
/* SECCOMP_RET_DATA of a trapped call: its class */
enum { CL_NONE = 0, CL_EXEC = 1, CL_PROCESS = 2, CL_NETWORK = 3, CL_FILE = 4, CL_SYSCALL = 5, CL_SIGMASK = 6,
       CL_GPU = 7 /* not a trap: the GPU faulted under the kernel (the error's name in msg) */ };

/* how long the timer spins on a call's return before it sleeps: until the kernel's thread count
 * is known, then adapt_spin's choice (params.spin_us fixes it) */
#define JUDGE_SPIN_NS 0LL
#define JUDGE_SPIN_FREE_CORE_NS 1000000LL
#define JUDGE_SPIN_CUDA_NS 1000000000LL /* (the deadline and the child's death are still looked at every 4096 spins) */

/* the shared control page */
typedef struct {
  _Alignas(64) _Atomic uint32_t go;
  _Alignas(64) _Atomic uint32_t done;
  _Alignas(64) _Atomic int32_t cmd;
  _Atomic int32_t idle; /* the parent announced a long pause: the child may sleep on `go` */
  _Alignas(64) _Atomic int32_t parent_waiting; /* the parent sleeps on `done`: the child wakes it */
  int32_t rc;
  int32_t fault;        /* 1: a fault record below */
  int32_t exit_called;  /* the kernel called exit() (atexit ran) */
  char f_name[32];      /* a libc guard's function (detect mode; f_sig 0) */
  int32_t f_sig, f_code, f_class, f_nr;
  uint64_t f_addr;
  char msg[512];
  int64_t event_ns;     /* CUDA: the events around the last call (the kernel's process writes it: information) */
} ctl_page;

typedef struct {
  int fd;
  char* map;       /* [guard | body | guard], the parent's RW view (the child maps the same address) */
  size_t map_len, guard, data_off, nbytes;
  int is_input, index;
  et_tensor* t;    /* the agent's tensor (for shape/dtype; bind tells which is which) */
} jbuf;

typedef struct {
  ctl_page* ctl;
  pid_t child;
  int child_status, child_reaped;
  uint32_t seq;
  int abi_tvm;
  char entry[256];
  char artifact[PATH_MAX];
  int nthreads;
  double timeout_s;
  int64_t deadline_ns;
  jbuf bufs[MAX_BUFS];
  int n_bufs;
  int n_in, n_out;
  int in_idx[MAX_BUFS], out_idx[MAX_BUFS]; /* bind order -> bufs[] */
  int bound;
  int seccomp_ok;
  char seccomp_why[128];
  long long handshake_ns;
  long long spin_ns; /* how long the timer spins on `done` before it sleeps (adapt_spin) */
  int spin_fixed;    /* params.spin_us gave it */
  /* detect mode baseline */
  char cmdline0[1024];
  size_t cmdline0_len;
  unsigned long long cminflt0, cutime0;
  int wfd0[256];
  int n_wfd0;
  char fault_code[40];
  char fault_detail[481]; /* the host takes at most 500 characters */
  int sealed;             /* inputs sealed F_SEAL_FUTURE_WRITE (Linux >= 5.1) */
  /* params.device "cuda" */
  int cuda;
  char cuda_driver[PATH_MAX];
  int cuda_ordinal;
  int64_t last_ns;        /* RUN's round trip (the sample) */
  double event_sum_ns;    /* the events' sum and count (information) */
  long long event_n;
} judge_state;

/* a seccomp-BPF program (judge_seccomp.c builds it, the kernel child installs it) */
typedef struct {
  struct sock_filter f[512];
  int n;
} bpf_prog;

static inline int64_t jb_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline size_t jb_page_size(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

/* Used across the judge's files. Hidden: the agent's -rdynamic does not export them, so, as when they
 * were static, a kernel's symbols never bind to them and jb_check_elf's dlsym(RTLD_DEFAULT) (the
 * interposed-symbol check) does not see them. */
#pragma GCC visibility push(hidden)
/* judge_buffers.c */
judge_state* jb_state_of(backend* b);
int judge_alloc(backend* b, et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape, int is_input, char* err,
                size_t errlen);
/* judge_seccomp.c */
const char* jb_syscall_name(long nr);
void jb_build_filter(bpf_prog* p, int stage2, pid_t me, int cuda);
int jb_install_filter(bpf_prog* p, int all_threads);
/* judge_elf.c */
int jb_check_elf(judge_state* s, const char* path, char* err, size_t errlen);
/* judge_child.c */
void jb_child_main(judge_state* s, pid_t parent);
/* judge_faults.c */
void jb_set_fault(judge_state* s, const char* code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void jb_classify_death(judge_state* s);
int jb_reap(judge_state* s, int block);
int jb_call(judge_state* s, int cmd, char* err, size_t errlen);
ssize_t jb_read_file(const char* path, char* buf, size_t cap);
void jb_detect_baseline(judge_state* s);
void jb_detect(judge_state* s);
#pragma GCC visibility pop

#endif /* EDGETUNE_JUDGE_INTERNAL_H_ */
