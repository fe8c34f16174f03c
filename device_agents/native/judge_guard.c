/* The judge's libc guards, for "detect" mode (no seccomp: qemu-user). The agent binary exports these
 * libc names (-rdynamic), and the main executable comes first in the global lookup scope, so a kernel
 * .so's calls to them bind here. Inert (a pass-through to libc's, found with RTLD_NEXT) everywhere
 * but in the kernel child in detect mode, where a forbidden call is recorded as a fault and the child
 * exits, as the seccomp trap does. A kernel that makes the system call itself (inline asm, syscall())
 * is not seen here: /proc inspection between runs is what is left. Not in a static agent (no judge). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#undef _FORTIFY_SOURCE /* the headers' inline open() would clash with the definitions here */
volatile int g_judge_guard; /* set in the kernel child in detect mode only */

#ifndef ET_STATIC
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "backend.h"

/* judge_backend.c: record (class, name) in the control page and exit */
void judge_guard_trip(int cls, const char* name);

enum { G_EXEC = 1, G_PROCESS = 2, G_NETWORK = 3, G_FILE = 4, G_SYSCALL = 5 };
#define WRITE_FLAGS (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)
#ifdef O_TMPFILE
#define ET_O_TMPFILE O_TMPFILE
#else
#define ET_O_TMPFILE 0
#endif

#define REAL(type, name)                                          \
  static __typeof__(type) real_ = NULL;                           \
  if (!real_) real_ = (__typeof__(type))dlsym(RTLD_NEXT, name);   \
  if (!real_) return -1

static int write_mode(const char* mode) {
  return mode && (mode[0] == 'w' || mode[0] == 'a' || (mode[0] && mode[1] == '+') ||
                  (mode[0] && mode[1] && mode[2] == '+'));
}

/* ---- exec ---- */
int execve(const char* p, char* const a[], char* const e[]) {
  if (g_judge_guard) judge_guard_trip(G_EXEC, "execve");
  REAL(int (*)(const char*, char* const*, char* const*), "execve");
  return real_(p, a, e);
}
int execv(const char* p, char* const a[]) {
  if (g_judge_guard) judge_guard_trip(G_EXEC, "execv");
  REAL(int (*)(const char*, char* const*), "execv");
  return real_(p, a);
}
int execvp(const char* p, char* const a[]) {
  if (g_judge_guard) judge_guard_trip(G_EXEC, "execvp");
  REAL(int (*)(const char*, char* const*), "execvp");
  return real_(p, a);
}
int execvpe(const char* p, char* const a[], char* const e[]) {
  if (g_judge_guard) judge_guard_trip(G_EXEC, "execvpe");
  REAL(int (*)(const char*, char* const*, char* const*), "execvpe");
  return real_(p, a, e);
}
int fexecve(int fd, char* const a[], char* const e[]) {
  if (g_judge_guard) judge_guard_trip(G_EXEC, "fexecve");
  REAL(int (*)(int, char* const*, char* const*), "fexecve");
  return real_(fd, a, e);
}

/* ---- processes ---- */
pid_t fork(void) {
  if (g_judge_guard) judge_guard_trip(G_PROCESS, "fork");
  REAL(pid_t (*)(void), "fork");
  return real_();
}
pid_t vfork(void) { /* a fork is a valid vfork */
  if (g_judge_guard) judge_guard_trip(G_PROCESS, "vfork");
  return fork();
}
int system(const char* cmd) {
  if (g_judge_guard) judge_guard_trip(G_PROCESS, "system");
  REAL(int (*)(const char*), "system");
  return real_(cmd);
}
FILE* popen(const char* cmd, const char* mode) {
  if (g_judge_guard) judge_guard_trip(G_PROCESS, "popen");
  static FILE* (*real_)(const char*, const char*) = NULL;
  if (!real_) real_ = (FILE * (*)(const char*, const char*)) dlsym(RTLD_NEXT, "popen");
  return real_ ? real_(cmd, mode) : NULL;
}
int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* fa, const posix_spawnattr_t* at,
                char* const argv[], char* const envp[]) {
  if (g_judge_guard) judge_guard_trip(G_PROCESS, "posix_spawn");
  REAL(int (*)(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*, char* const*,
               char* const*), "posix_spawn");
  return real_(pid, path, fa, at, argv, envp);
}
int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* fa, const posix_spawnattr_t* at,
                 char* const argv[], char* const envp[]) {
  if (g_judge_guard) judge_guard_trip(G_PROCESS, "posix_spawnp");
  REAL(int (*)(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*, char* const*,
               char* const*), "posix_spawnp");
  return real_(pid, file, fa, at, argv, envp);
}

/* ---- network ---- */
int socket(int d, int t, int p) {
  if (g_judge_guard) judge_guard_trip(G_NETWORK, "socket");
  REAL(int (*)(int, int, int), "socket");
  return real_(d, t, p);
}
int socketpair(int d, int t, int p, int sv[2]) {
  if (g_judge_guard) judge_guard_trip(G_NETWORK, "socketpair");
  REAL(int (*)(int, int, int, int*), "socketpair");
  return real_(d, t, p, sv);
}
int connect(int fd, const struct sockaddr* a, socklen_t l) {
  if (g_judge_guard) judge_guard_trip(G_NETWORK, "connect");
  REAL(int (*)(int, const struct sockaddr*, socklen_t), "connect");
  return real_(fd, a, l);
}
int bind(int fd, const struct sockaddr* a, socklen_t l) {
  if (g_judge_guard) judge_guard_trip(G_NETWORK, "bind");
  REAL(int (*)(int, const struct sockaddr*, socklen_t), "bind");
  return real_(fd, a, l);
}
int listen(int fd, int n) {
  if (g_judge_guard) judge_guard_trip(G_NETWORK, "listen");
  REAL(int (*)(int, int), "listen");
  return real_(fd, n);
}
int accept(int fd, struct sockaddr* a, socklen_t* l) {
  if (g_judge_guard) judge_guard_trip(G_NETWORK, "accept");
  REAL(int (*)(int, struct sockaddr*, socklen_t*), "accept");
  return real_(fd, a, l);
}
int accept4(int fd, struct sockaddr* a, socklen_t* l, int fl) {
  if (g_judge_guard) judge_guard_trip(G_NETWORK, "accept4");
  REAL(int (*)(int, struct sockaddr*, socklen_t*, int), "accept4");
  return real_(fd, a, l, fl);
}

/* ---- files (reading stays allowed) ---- */
#define OPEN_LIKE(fn)                                                      \
  int fn(const char* p, int flags, ...) {                                  \
    mode_t m = 0;                                                          \
    if (flags & (O_CREAT | ET_O_TMPFILE)) {                                 \
      va_list ap;                                                          \
      va_start(ap, flags);                                                 \
      m = (mode_t)va_arg(ap, int);                                         \
      va_end(ap);                                                          \
    }                                                                      \
    if (g_judge_guard && (flags & WRITE_FLAGS)) judge_guard_trip(G_FILE, #fn); \
    REAL(int (*)(const char*, int, ...), #fn);                             \
    return real_(p, flags, m);                                             \
  }
OPEN_LIKE(open)
OPEN_LIKE(open64)
#define OPENAT_LIKE(fn)                                                    \
  int fn(int dfd, const char* p, int flags, ...) {                         \
    mode_t m = 0;                                                          \
    if (flags & (O_CREAT | ET_O_TMPFILE)) {                                 \
      va_list ap;                                                          \
      va_start(ap, flags);                                                 \
      m = (mode_t)va_arg(ap, int);                                         \
      va_end(ap);                                                          \
    }                                                                      \
    if (g_judge_guard && (flags & WRITE_FLAGS)) judge_guard_trip(G_FILE, #fn); \
    REAL(int (*)(int, const char*, int, ...), #fn);                        \
    return real_(dfd, p, flags, m);                                        \
  }
OPENAT_LIKE(openat)
OPENAT_LIKE(openat64)
#ifdef __GLIBC__
/* what _FORTIFY_SOURCE builds of a kernel call instead of open/openat */
int __open_2(const char* p, int flags) {
  if (g_judge_guard && (flags & WRITE_FLAGS)) judge_guard_trip(G_FILE, "open");
  REAL(int (*)(const char*, int), "__open_2");
  return real_(p, flags);
}
int __open64_2(const char* p, int flags) {
  if (g_judge_guard && (flags & WRITE_FLAGS)) judge_guard_trip(G_FILE, "open64");
  REAL(int (*)(const char*, int), "__open64_2");
  return real_(p, flags);
}
int __openat_2(int dfd, const char* p, int flags) {
  if (g_judge_guard && (flags & WRITE_FLAGS)) judge_guard_trip(G_FILE, "openat");
  REAL(int (*)(int, const char*, int), "__openat_2");
  return real_(dfd, p, flags);
}
#endif
int creat(const char* p, mode_t m) {
  if (g_judge_guard) judge_guard_trip(G_FILE, "creat");
  REAL(int (*)(const char*, mode_t), "creat");
  return real_(p, m);
}
#define FOPEN_LIKE(fn)                                                     \
  FILE* fn(const char* p, const char* mode) {                              \
    if (g_judge_guard && write_mode(mode)) judge_guard_trip(G_FILE, #fn);  \
    static FILE* (*real_)(const char*, const char*) = NULL;                \
    if (!real_) real_ = (FILE * (*)(const char*, const char*)) dlsym(RTLD_NEXT, #fn); \
    return real_ ? real_(p, mode) : NULL;                                  \
  }
FOPEN_LIKE(fopen)
FOPEN_LIKE(fopen64)
FILE* freopen(const char* p, const char* mode, FILE* f) {
  if (g_judge_guard && (write_mode(mode) || !p)) judge_guard_trip(G_FILE, "freopen");
  static FILE* (*real_)(const char*, const char*, FILE*) = NULL;
  if (!real_) real_ = (FILE * (*)(const char*, const char*, FILE*)) dlsym(RTLD_NEXT, "freopen");
  return real_ ? real_(p, mode, f) : NULL;
}
#define PATH1(fn, cls)                                  \
  int fn(const char* p) {                               \
    if (g_judge_guard) judge_guard_trip(cls, #fn);      \
    REAL(int (*)(const char*), #fn);                    \
    return real_(p);                                    \
  }
PATH1(unlink, G_FILE)
PATH1(remove, G_FILE)
PATH1(rmdir, G_FILE)
int mkdir(const char* p, mode_t m) {
  if (g_judge_guard) judge_guard_trip(G_FILE, "mkdir");
  REAL(int (*)(const char*, mode_t), "mkdir");
  return real_(p, m);
}
int rename(const char* a, const char* b) {
  if (g_judge_guard) judge_guard_trip(G_FILE, "rename");
  REAL(int (*)(const char*, const char*), "rename");
  return real_(a, b);
}
int truncate(const char* p, off_t l) {
  if (g_judge_guard) judge_guard_trip(G_FILE, "truncate");
  REAL(int (*)(const char*, off_t), "truncate");
  return real_(p, l);
}

/* ---- other processes ---- */
int kill(pid_t pid, int sig) {
  if (g_judge_guard && pid != getpid()) judge_guard_trip(G_SYSCALL, "kill");
  REAL(int (*)(pid_t, int), "kill");
  return real_(pid, sig);
}
#ifdef __GLIBC__
typedef enum __ptrace_request ptrace_req;
#else
typedef int ptrace_req;
#endif
long ptrace(ptrace_req req, ...) {
  if (g_judge_guard) judge_guard_trip(G_SYSCALL, "ptrace");
  va_list ap;
  va_start(ap, req);
  pid_t pid = va_arg(ap, pid_t);
  void* addr = va_arg(ap, void*);
  void* data = va_arg(ap, void*);
  va_end(ap);
  REAL(long (*)(ptrace_req, pid_t, void*, void*), "ptrace");
  return real_(req, pid, addr, data);
}
#endif
