/* The supervisor of run-stdio (PROTOCOL.md "The supervisor"): its state, the job's process tree and
 * cgroups, and the functions its four files share. */
#ifndef ET_SUPERVISOR_H
#define ET_SUPERVISOR_H
#include "agent_internal.h"

/* ------------------------------------------------------------------ supervisor (run-stdio) */
/* run-stdio runs the job in a worker process and watches it from here (PROTOCOL.md "The supervisor").
 * Every POLL_NS the supervisor reaps, checks the deadline and looks at the job's processes: from its
 * cgroups when it has them (cgroup.procs and the OOM counter: two small reads), else from /proc (a
 * directory listing; only processes new since the last look are read, by their ppid) and the statm
 * of each of the job's processes. 10 ms bounds how far past a bound a job gets (a deadline by 10 ms,
 * a hog by what it can fault in in 10 ms, ~20-40 MB) while the supervisor sleeps nearly all the
 * time: a timed call is interrupted at most once per 10 ms, for tens of microseconds, and only
 * where supervisor and candidate share a core. When a look costs more (a large tree, a slow board)
 * the supervisor sleeps 50 times as long as it worked, up to POLL_MAX_NS: it never takes more than
 * ~2% of one core from the candidate. */
#define POLL_NS 10000000LL
#define POLL_MAX_NS 100000000LL
#define WORK_FACTOR 50
#define RESCAN_NS 1000000000LL      /* every process in /proc is read again this often (a reused pid) */
#define PSS_EVERY_NS 200000000LL    /* the costlier PSS confirmation of a tree over its bound, at most this often */
#define SWEEP_GIVE_UP_NS 10000000000LL /* a process that survives SIGKILL this long is stuck in the kernel */
#define SWEEP_POLL_MAX_NS 50000000LL /* the sweep looks again after 1, 2, 4 ... ms, then every 50 ms */
#define LOG_NAME "agent.log"        /* the worker's stdout and stderr; its tail goes to the agent's stderr */
#define LOG_TAIL 8192
#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif


typedef struct {
  pid_t pid, ppid;
  char state, kind; /* kind: 0 not looked at, 1 the job's, 2 not the job's, 3 read, parent not placed yet */
} proc_ent;

typedef struct {
  proc_ent* v;
  size_t n, cap;
} proc_list;

/* The job's processes kept up to date cheaply: a process that is not the job's when first seen never
 * becomes the job's (orphans go to the supervisor, a subreaper), so only new pids are read. */
typedef struct {
  pid_t root;
  proc_list known, next;
  int64_t next_rescan;
} tree_t;

typedef struct {
  char dir[PATH_MAX];
  int version; /* 0: none */
} cg_t;

typedef struct {
  cg_t mem, pids;
  char made[2][PATH_MAX];
  int n_made;
} cgroups_t;

typedef struct {
  char fstype[16], mnt[PATH_MAX], root[PATH_MAX], opts[256];
} cg_mount;

typedef struct {
  char jobdir[PATH_MAX];
  int64_t started;
  limits_t lim;
  pid_t me, worker;
  int worker_done, worker_status;
  long long worker_maxrss_kb;
  tree_t tree;
  pid_t* members;
  size_t n_members, cap_members;
  long long rss_kb, peak_kb;
  int peak_procs, leftover, unkillable;
  int64_t next_pss;
  cgroups_t cg;
  long long nproc; /* RLIMIT_NPROC of the worker; 0: not set */
  int subreaper;   /* orphans of the job come to the supervisor */
  long long forks_refused; /* the pids cgroup's refusal counter at the last look */
  int refusing;            /* consecutive looks that found the pids cgroup refusing forks */
  const char* enforced_memory;
  const char* enforced_processes;
  const char* limit; /* the bound broken: memory, processes, time, output; NULL */
  const char* status;
  const char* signal;
  char reason[ERRLEN];
} supervisor;


/* supervisor_procs.c, supervisor_cgroup.c, supervisor_bundle.c, supervisor.c (hidden, as in agent_internal.h) */
#pragma GCC visibility push(hidden)
extern volatile sig_atomic_t g_stop_signal;
long long proc_pss_kb(pid_t pid);
int proc_list_pids(proc_list* l);
int proc_stat(proc_ent* e);
long proc_mark_descendants(proc_list* l, pid_t root);
long proc_tree_refresh(tree_t* t, int64_t now, long stop);
ssize_t sv_read_small(const char* path, char* buf, size_t cap);
int sv_write_small(const char* path, const char* text);
int sv_has_word(const char* list, const char* word, char sep);
const char* sv_signal_name(int sig);
int sv_runs_this_job(int procfd, const char* name, const char* jobdir);
void sv_lower_rlimit(int which, rlim_t value);
rlim_t sv_data_limit_bytes(long long memory_mb);
int sv_rlimit_data_takes(void);
long long sv_user_tasks(void);
void sv_emit_bundle(supervisor* sv);
void sv_fields(const supervisor* sv, sbuf* o);
int sv_violation(supervisor* sv, const char* limit, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
int cg_any(const cgroups_t* cg);
int cg_members(const cgroups_t* cg, pid_t** pids, size_t* cap);
long long cg_forks_refused(const cgroups_t* cg);
long long cg_read_ll(const cg_t* c, const char* v1, const char* v2, const char* key);
long long pids_cgroup_max(long long max_procs);
long long cg_oom_kills(const cgroups_t* cg);
long long cg_memory_bytes(const cgroups_t* cg, int peak);
void cg_kill_all(const cgroups_t* cg, pid_t** pids, size_t* cap);
void cg_setup(cgroups_t* cg, const char* tag, long long memory_mb, long long max_procs);
void cg_add(cgroups_t* cg, pid_t pid);
void cg_remove(cgroups_t* cg);
#pragma GCC visibility pop

#endif /* ET_SUPERVISOR_H */
