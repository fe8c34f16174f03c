/* What the native agent's files share: the job's state (run_state), its bounds (limits_t) and the
 * functions one file of the agent calls in another. Not an API: nothing outside device_agents/native
 * includes it.
 *   agent.c                 main, `info`
 *   job.c, job_run.c        the worker: `run JOBDIR` (run_job is the timed run)
 *   supervisor*.c           `run-stdio`: the supervisor around the worker (supervisor.h)
 */
#ifndef ET_AGENT_INTERNAL_H
#define ET_AGENT_INTERNAL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "fingerprint.h"
#include "json.h"
#include "sha256.h"
#include "tensor.h"

#ifndef ET_AGENT_VERSION
#define ET_AGENT_VERSION "0.1.0"

#endif

#define ERRLEN 1024
#define ET_MAX_CHECKS 32
#define PROTOCOL 3
#define WARMUP_MIN_ITERS 5 /* warm-up iterations at least (2 for a model slower than the warm-up) */
#define WARMUP_KEEP 4096   /* the timed run is planned from the median of the first this many */

/* the bounds of a request (PROTOCOL.md "limits"); 0: no bound of that kind */
typedef struct {
  long long memory_mb, max_procs, max_bundle;
  double timeout_s;
} limits_t;

typedef struct {
  char jobdir[PATH_MAX];
  char agent_dir[PATH_MAX];
  char reason[ERRLEN];
  const char* limit; /* a bound the job ran into ("memory", "processes"), else NULL */
  limits_t limits;
  int status_ok;
  double load_ms;
  long long warmup_iters;
  int64_t* samples;
  size_t n_samples;
  int n_sets, n_in, n_out;
  char (*sha_before)[65];
  int have_before;
  int outputs_written; /* sets whose outputs were written */
  int rep_written;
  char (*sha_after_sets)[65]; /* work buffers after each input set's run */
  int have_after_sets;
  long long first_timed_iter;
  long long kept_iter[ET_MAX_CHECKS];
  int64_t kept_ns[ET_MAX_CHECKS];
  int kept_used[ET_MAX_CHECKS];
  int kept_written;
  char (*kept_sha)[65];         /* [ET_MAX_CHECKS * n_in] */
  long long late_iter;          /* -1: none */
  char late_outputs[128];
  int64_t* probe_rep;
  int64_t* probe_dist;
  int n_probe;
  char guard_violation[256];
  int judged;              /* the judge backend: result.fault is written (null or the fault) */
  char fault_code[40];
  char fault_detail[512];
  sbuf versions;
  sbuf details;
} run_state;


static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}


/* job.c, job_run.c and the one function of supervisor_procs.c the worker uses. Hidden: the agent links
 * with -rdynamic, and these are not for kernels to bind to (or for the judge's interposed-symbol check
 * to find) */
#pragma GCC visibility push(hidden)
int job_fail(run_state* r, const char* fmt, const char* detail);
void job_path(const char* jobdir, const char* p, char* out, size_t outlen);
int job_parse_limits(const jval* req, limits_t* lim, char* err, size_t errlen);
int job_hash_inputs(et_tensor** sets, run_state* r, char (*out)[65]);
void job_fill_set(et_tensor* work, const et_tensor* base, int n_in);
void job_fill_fresh(et_tensor* work, et_tensor** sets, int n_sets, int n_in, uint64_t seed, long long t);
int job_guards_ok(run_state* r, backend* be, const et_tensor* work, const et_tensor* outs);
int job_save_npy(const char* path, const et_tensor* t, char* err, size_t errlen);
int64_t job_run_ns(backend* be, const backend_hooks* hk, int64_t wall);
int job_cmp_i64(const void* a, const void* b);
uint64_t job_urandom64(void);
uint64_t job_xorshift(uint64_t* s);
int run_job(run_state* r);
int cmd_run(const char* jobdir, const char* dir);
long long proc_resident_kb(pid_t pid);
int cmd_run_stdio(const char* jobdir, const char* dir);
#pragma GCC visibility pop

#endif /* ET_AGENT_INTERNAL_H */
