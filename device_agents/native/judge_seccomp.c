/* The judge's seccomp-BPF sandbox: syscall names, the filter's two stages, installing it, the probe. */
#include "judge_internal.h"

/* ------------------------------------------------------------------ syscall names */

typedef struct {
  long nr;
  const char* name;
} sysname;

#define SN(x) {SYS_##x, #x}
static const sysname kNames[] = {
#ifdef SYS_execve
    SN(execve),
#endif
#ifdef SYS_execveat
    SN(execveat),
#endif
#ifdef SYS_fork
    SN(fork),
#endif
#ifdef SYS_vfork
    SN(vfork),
#endif
    SN(clone), SN(socket), SN(socketpair), SN(connect), SN(bind), SN(listen), SN(accept4),
#ifdef SYS_accept
    SN(accept),
#endif
#ifdef SYS_open
    SN(open),
#endif
    SN(openat),
#ifdef SYS_creat
    SN(creat),
#endif
#ifdef SYS_mkdir
    SN(mkdir),
#endif
    SN(mkdirat),
#ifdef SYS_unlink
    SN(unlink),
#endif
    SN(unlinkat),
#ifdef SYS_rename
    SN(rename),
#endif
#ifdef SYS_renameat
    SN(renameat),
#endif
#ifdef SYS_renameat2
    SN(renameat2),
#endif
#ifdef SYS_link
    SN(link),
#endif
    SN(linkat),
#ifdef SYS_symlink
    SN(symlink),
#endif
    SN(symlinkat),
#ifdef SYS_mknod
    SN(mknod),
#endif
    SN(mknodat), SN(truncate),
#ifdef SYS_chmod
    SN(chmod),
#endif
    SN(fchmod), SN(fchmodat),
#ifdef SYS_chown
    SN(chown),
#endif
#ifdef SYS_lchown
    SN(lchown),
#endif
    SN(fchown), SN(fchownat), SN(ptrace), SN(process_vm_readv), SN(process_vm_writev), SN(kill), SN(tkill),
    SN(tgkill),
#ifdef SYS_pidfd_open
    SN(pidfd_open),
#endif
#ifdef SYS_pidfd_getfd
    SN(pidfd_getfd),
#endif
#ifdef SYS_pidfd_send_signal
    SN(pidfd_send_signal),
#endif
#ifdef SYS_io_uring_setup
    SN(io_uring_setup), SN(io_uring_enter), SN(io_uring_register),
#endif
    SN(bpf), SN(perf_event_open), SN(userfaultfd), SN(mount), SN(umount2), SN(unshare), SN(setns), SN(chroot),
    SN(pivot_root), SN(keyctl), SN(add_key), SN(request_key), SN(init_module), SN(finit_module),
    SN(delete_module), SN(kexec_load),
#ifdef SYS_kexec_file_load
    SN(kexec_file_load),
#endif
    SN(reboot), SN(swapon), SN(swapoff), SN(personality), SN(setuid), SN(setgid), SN(setreuid), SN(setregid),
    SN(setresuid), SN(setresgid), SN(setfsuid), SN(setfsgid), SN(setgroups), SN(rt_sigaction),
};

const char* jb_syscall_name(long nr) {
  for (size_t i = 0; i < sizeof kNames / sizeof *kNames; i++)
    if (kNames[i].nr == nr) return kNames[i].name;
  return NULL;
}

/* ------------------------------------------------------------------ seccomp-BPF */

static void emit(bpf_prog* p, struct sock_filter ins) {
  if (p->n < (int)(sizeof p->f / sizeof *p->f)) p->f[p->n++] = ins;
}
#define LD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LD_ARG(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define TRAP(cl) (SECCOMP_RET_TRAP | (uint32_t)(cl))

/* nr -> action */
static void rule(bpf_prog* p, long nr, uint32_t action) {
  emit(p, (struct sock_filter)LD_NR);
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1));
  emit(p, (struct sock_filter)RET(action));
}

/* nr: if (args[i] & mask) != 0 -> yes, else no */
static void rule_mask(bpf_prog* p, long nr, int arg, uint32_t mask, uint32_t yes, uint32_t no) {
  emit(p, (struct sock_filter)LD_NR);
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 4));
  emit(p, (struct sock_filter)LD_ARG(arg));
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, mask, 0, 1));
  emit(p, (struct sock_filter)RET(yes));
  emit(p, (struct sock_filter)RET(no));
}

/* nr: if args[i] == val -> yes, else no (the low 32 bits: little-endian targets) */
static void rule_eq(bpf_prog* p, long nr, int arg, uint32_t val, uint32_t yes, uint32_t no) {
  emit(p, (struct sock_filter)LD_NR);
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 4));
  emit(p, (struct sock_filter)LD_ARG(arg));
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, val, 0, 1));
  emit(p, (struct sock_filter)RET(yes));
  emit(p, (struct sock_filter)RET(no));
}

void jb_build_filter(bpf_prog* p, int stage2, pid_t me, int cuda) {
  p->n = 0;
  emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ET_AUDIT_ARCH, 1, 0));
  emit(p, (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS));
#if defined(__x86_64__)
  emit(p, (struct sock_filter)LD_NR);
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));
  emit(p, (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS));
#endif
  const uint32_t A = SECCOMP_RET_ALLOW;
  /* exec */
#ifdef SYS_execve
  rule(p, SYS_execve, TRAP(CL_EXEC));
#endif
#ifdef SYS_execveat
  rule(p, SYS_execveat, TRAP(CL_EXEC));
#endif
  /* processes: threads only */
#ifdef SYS_fork
  rule(p, SYS_fork, TRAP(CL_PROCESS));
#endif
#ifdef SYS_vfork
  rule(p, SYS_vfork, TRAP(CL_PROCESS));
#endif
  /* clone: threads only (CLONE_THREAD), and no new namespaces even for a thread */
  emit(p, (struct sock_filter)LD_NR);
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)SYS_clone, 0, 6));
  emit(p, (struct sock_filter)LD_ARG(0));
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K,
                                       CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                                           CLONE_NEWPID | CLONE_NEWNET, 0, 1));
  emit(p, (struct sock_filter)RET(TRAP(CL_SYSCALL)));
  emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1));
  emit(p, (struct sock_filter)RET(A));
  emit(p, (struct sock_filter)RET(TRAP(CL_PROCESS)));
#ifdef SYS_clone3
  rule(p, SYS_clone3, SECCOMP_RET_ERRNO | ENOSYS);
#endif
  /* network */
  static const long net[] = {SYS_socket, SYS_socketpair, SYS_connect, SYS_bind, SYS_listen, SYS_accept4,
#ifdef SYS_accept
                             SYS_accept,
#endif
  };
  for (size_t i = 0; i < sizeof net / sizeof *net; i++) rule(p, net[i], TRAP(CL_NETWORK));
  /* files */
  const uint32_t wr = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND;
#ifdef SYS_open
  if (stage2) rule(p, SYS_open, TRAP(CL_FILE));
  else rule_mask(p, SYS_open, 1, wr, TRAP(CL_FILE), A);
#endif
  if (stage2) rule(p, SYS_openat, TRAP(CL_FILE));
  else rule_mask(p, SYS_openat, 2, wr, TRAP(CL_FILE), A);
#ifdef SYS_openat2
  rule(p, SYS_openat2, SECCOMP_RET_ERRNO | ENOSYS);
#endif
  static const long files[] = {
#ifdef SYS_creat
      SYS_creat,
#endif
#ifdef SYS_mkdir
      SYS_mkdir,
#endif
#ifdef SYS_unlink
      SYS_unlink,
#endif
#ifdef SYS_rename
      SYS_rename,
#endif
#ifdef SYS_renameat
      SYS_renameat,
#endif
#ifdef SYS_renameat2
      SYS_renameat2,
#endif
#ifdef SYS_link
      SYS_link,
#endif
#ifdef SYS_symlink
      SYS_symlink,
#endif
#ifdef SYS_mknod
      SYS_mknod,
#endif
#ifdef SYS_chmod
      SYS_chmod,
#endif
#ifdef SYS_chown
      SYS_chown,
#endif
#ifdef SYS_lchown
      SYS_lchown,
#endif
      SYS_mkdirat, SYS_unlinkat, SYS_linkat, SYS_symlinkat, SYS_mknodat, SYS_truncate, SYS_fchmod,
      SYS_fchmodat, SYS_fchown, SYS_fchownat,
  };
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) rule(p, files[i], TRAP(CL_FILE));
  /* signals: only to itself; SIGSYS's handler stays the agent's */
  rule_eq(p, SYS_kill, 0, (uint32_t)me, A, TRAP(CL_SYSCALL));
  rule_eq(p, SYS_tgkill, 0, (uint32_t)me, A, TRAP(CL_SYSCALL));
  rule_eq(p, SYS_tkill, 0, (uint32_t)me, A, TRAP(CL_SYSCALL));
  rule_eq(p, SYS_rt_sigaction, 0, SIGSYS, SECCOMP_RET_KILL_PROCESS, A);
  /* a blocked SIGSYS (or SIGSEGV, ...) would turn a trap into a death without a record (glibc blocks
   * every signal around clone in posix_spawn and pthread_create): the handler emulates the call and
   * keeps those unblocked. Not in CUDA mode: the driver's threads, started before the filter with
   * every signal blocked, restore their mask with this call when they first run, which may be after
   * the filter (TSYNC) on a busy machine; trapped with SIGSYS blocked, that would kill the process.
   * There a kernel that blocks SIGSYS and then makes a forbidden call dies of SIGSYS: still
   * forbidden-syscall, without the call's name. */
  if (!cuda) rule(p, SYS_rt_sigprocmask, TRAP(CL_SIGMASK));
  static const long sys[] = {
      SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev,
#ifdef SYS_pidfd_open
      SYS_pidfd_open,
#endif
#ifdef SYS_pidfd_getfd
      SYS_pidfd_getfd,
#endif
#ifdef SYS_pidfd_send_signal
      SYS_pidfd_send_signal,
#endif
#ifdef SYS_io_uring_setup
      SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register,
#endif
      SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_mount, SYS_umount2, SYS_unshare, SYS_setns,
      SYS_chroot, SYS_pivot_root, SYS_keyctl, SYS_add_key, SYS_request_key, SYS_init_module,
      SYS_finit_module, SYS_delete_module, SYS_kexec_load,
#ifdef SYS_kexec_file_load
      SYS_kexec_file_load,
#endif
      SYS_reboot, SYS_swapon, SYS_swapoff, SYS_personality, SYS_setuid, SYS_setgid, SYS_setreuid,
      SYS_setregid, SYS_setresuid, SYS_setresgid, SYS_setfsuid, SYS_setfsgid, SYS_setgroups,
  };
  for (size_t i = 0; i < sizeof sys / sizeof *sys; i++) rule(p, sys[i], TRAP(CL_SYSCALL));
  emit(p, (struct sock_filter)RET(A));
}

int jb_install_filter(bpf_prog* p, int all_threads) {
  struct sock_fprog prog = {(unsigned short)p->n, p->f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
#ifdef SYS_seccomp
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, all_threads ? 1u /* SECCOMP_FILTER_FLAG_TSYNC */ : 0u, &prog) == 0)
    return 0;
  if (errno != ENOSYS || all_threads) return -1;
#endif
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
}

/* 0 when a forked child can install a filter; else -1 and why */
int judge_seccomp_probe(char* why, size_t whylen) {
  int pfd[2];
  if (pipe(pfd)) {
    snprintf(why, whylen, "%s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, whylen, "%s", strerror(errno));
    close(pfd[0]);
    close(pfd[1]);
    return -1;
  }
  if (pid == 0) {
    close(pfd[0]);
    struct sock_filter f[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    bpf_prog p;
    p.n = 1;
    p.f[0] = f[0];
    int e = jb_install_filter(&p, 0) ? errno : 0;
    ssize_t w = write(pfd[1], &e, sizeof e);
    (void)w;
    _exit(0);
  }
  close(pfd[1]);
  int e = -1;
  ssize_t got;
  do got = read(pfd[0], &e, sizeof e);
  while (got < 0 && errno == EINTR);
  close(pfd[0]);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
  if (got != (ssize_t)sizeof e) e = EIO;
  if (e) snprintf(why, whylen, "%s", strerror(e));
  return e ? -1 : 0;
}
