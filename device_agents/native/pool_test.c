/* Stress test of the agent's TVM backend hooks without a kernel: the thread pool behind
 * TVMBackendParallelLaunch, the barrier, nested launches, failing tasks and the workspace.
 * Built and run by tests/unit/test_native_agent.py (natively and under qemu-aarch64):
 *   cc -pthread pool_test.c tvm_backend.c json.c kernels_none.c -ldl -o pool_test && ./pool_test N [LAUNCHES]
 * LAUNCHES (default 50) lockstep launches of ROUNDS barrier rounds each; the test times one launch
 * first and sets the limit of the full run from it, so a loaded machine does not fail honest work. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "tvm_abi.h"

/* agent.c provides these in the real binary */
int param_int(const jval* params, const char* key, long long* out) { (void)params; (void)key; (void)out; return -1; }
const char* param_str(const jval* params, const char* key) { (void)params; (void)key; return NULL; }
int cpu_count(void) { return 1; }

#define ROUNDS 200
#define MAXT 64

typedef struct {
  atomic_int counts[MAXT];
  atomic_int seen[MAXT];
  atomic_int errors;
  int num_task;
} shared;

/* Every task bumps its counter, waits at the barrier, then checks all tasks reached the round. */
static int lockstep(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  shared* s = (shared*)cdata;
  s->num_task = penv->num_task;
  atomic_fetch_add(&s->seen[task_id], 1);
  for (int r = 0; r < ROUNDS; r++) {
    atomic_fetch_add(&s->counts[task_id], 1);
    TVMBackendParallelBarrier(task_id, penv);
    for (int t = 0; t < penv->num_task; t++)
      if (atomic_load(&s->counts[t]) < r + 1) atomic_fetch_add(&s->errors, 1);
    TVMBackendParallelBarrier(task_id, penv);
  }
  return 0;
}

static int inner(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  (void)task_id;
  if (penv->num_task != 1) atomic_fetch_add((atomic_int*)cdata, 1000);
  atomic_fetch_add((atomic_int*)cdata, 1);
  return 0;
}

static int nested(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  (void)task_id; (void)penv;
  return TVMBackendParallelLaunch(inner, cdata, 0);
}

static int failing(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  (void)penv; (void)cdata;
  if (task_id == penv->num_task - 1) {
    const char* parts[2] = {"task failed on purpose ", "(pool_test)"};
    TVMFFIErrorSetRaisedFromCStrParts("ValueError", parts, 2);
    return -1;
  }
  return 0;
}

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); return 1; } } while (0)

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  int launches = argc > 2 ? atoi(argv[2]) : 50;
  char err[256];
  CHECK(n >= 1 && n <= MAXT, "thread count");
  CHECK(launches >= 1, "launch count");
  CHECK(et_pool_start(n, err, sizeof err) == 0, "pool start: %s", err);
  for (int launch = 0; launch < launches; launch++) {
    shared* s = calloc(1, sizeof(shared));
    CHECK(TVMBackendParallelLaunch(lockstep, s, 0) == 0, "launch %d", launch);
    CHECK(s->num_task == n, "num_task %d != %d", s->num_task, n);
    for (int t = 0; t < n; t++) {
      CHECK(atomic_load(&s->seen[t]) == 1, "task %d ran %d times", t, atomic_load(&s->seen[t]));
      CHECK(atomic_load(&s->counts[t]) == ROUNDS, "task %d counted %d", t, atomic_load(&s->counts[t]));
    }
    CHECK(atomic_load(&s->errors) == 0, "barrier let %d tasks through early", atomic_load(&s->errors));
    free(s);
  }
  /* fewer tasks than threads */
  if (n > 1) {
    shared s2;
    memset(&s2, 0, sizeof s2);
    CHECK(TVMBackendParallelLaunch(lockstep, &s2, n - 1) == 0, "short launch");
    CHECK(s2.num_task == n - 1 && atomic_load(&s2.seen[n - 1]) == 0, "short launch ran %d tasks", s2.num_task);
  }
  /* a nested launch runs serially, as one task, inside each outer task */
  atomic_int hits = 0;
  CHECK(TVMBackendParallelLaunch(nested, &hits, 0) == 0, "nested launch");
  CHECK(atomic_load(&hits) == n, "nested: %d (want %d serial inner runs)", atomic_load(&hits), n);
  /* a failing task fails the launch; the pool keeps working */
  CHECK(TVMBackendParallelLaunch(failing, NULL, 0) == -1, "failing launch returned 0");
  shared* s3 = calloc(1, sizeof(shared));
  CHECK(TVMBackendParallelLaunch(lockstep, s3, 0) == 0 && atomic_load(&s3->errors) == 0, "after failure");
  free(s3);
  /* workspace: 64-byte aligned, writable */
  for (uint64_t sz = 1; sz < (1u << 22); sz = sz * 7 + 3) {
    unsigned char* p = TVMBackendAllocWorkspace(kDLCPU, 0, sz, kDLFloat, 32);
    CHECK(p && ((uintptr_t)p % 64) == 0, "workspace %llu", (unsigned long long)sz);
    memset(p, 0xAB, sz);
    CHECK(TVMBackendFreeWorkspace(kDLCPU, 0, p) == 0, "free");
  }
  et_pool_stop();
  printf("OK %d threads\n", n);
  return 0;
}
