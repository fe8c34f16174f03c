/* Backend "tvm-kernel": runs a kernel exported by TVM (`__tvm_ffi_main`) with no TVM runtime.
 *
 * An exported kernel needs only libc plus a handful of hooks that TVM's runtime normally
 * supplies. The kernel reaches most of them through function-pointer slots it defines itself
 * (`__TVMBackendParallelLaunch`, ... ; TVM's loader fills them after dlopen), and a few
 * (`TVMFFIErrorSetRaisedFromCStrParts`) as plain undefined symbols. The agent implements them
 * here, exports them (-rdynamic) and fills every slot it finds, so both routes work. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "linked.h"
#include "tvm_abi.h"

/* ------------------------------------------------------------------ errors */

static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_err[1024];

static void set_error(const char* kind, const char** parts, int n) {
  pthread_mutex_lock(&g_err_mu);
  size_t off = (size_t)snprintf(g_err, sizeof g_err, "%s: ", kind ? kind : "Error");
  for (int i = 0; i < n && off < sizeof g_err; i++)
    off += (size_t)snprintf(g_err + off, sizeof g_err - off, "%s", parts[i] ? parts[i] : "");
  pthread_mutex_unlock(&g_err_mu);
}

static void take_error(char* out, size_t outlen) {
  pthread_mutex_lock(&g_err_mu);
  snprintf(out, outlen, "%s", g_err[0] ? g_err : "kernel returned an error without a message");
  g_err[0] = 0;
  pthread_mutex_unlock(&g_err_mu);
}

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** message_parts,
                                       int32_t num_parts) {
  set_error(kind, message_parts, num_parts);
}

void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  set_error(kind, &message, 1);
}

/* ------------------------------------------------------------------ workspace */

void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                               int dtype_code_hint, int dtype_bits_hint) {
  (void)device_id; (void)dtype_code_hint; (void)dtype_bits_hint;
  if (device_type != kDLCPU) {
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", "native agent: workspace requested for a non-CPU device");
    return NULL;
  }
  void* p = NULL;
  /* 64 = TVM's kTempAllocaAlignment; kernels may assume it for vector loads */
  if (posix_memalign(&p, 64, nbytes ? (size_t)nbytes : 1)) {
    TVMFFIErrorSetRaisedFromCStr("MemoryError", "native agent: workspace allocation failed");
    return NULL;
  }
  return p;
}

int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type; (void)device_id;
  free(ptr);
  return 0;
}

/* ------------------------------------------------------------------ misc FFI hooks */

static pthread_mutex_t g_once_mu = PTHREAD_MUTEX_INITIALIZER;

int TVMFFIHandleInitOnce(void** handle_addr, int (*init_func)(void** result)) {
  int rc = 0;
  pthread_mutex_lock(&g_once_mu);
  if (*handle_addr == NULL) {
    void* r = NULL;
    rc = init_func(&r);
    if (rc == 0) *handle_addr = r;
  }
  pthread_mutex_unlock(&g_once_mu);
  return rc;
}

int TVMFFIFunctionCall(void* func, TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)func; (void)args; (void)num_args; (void)result;
  TVMFFIErrorSetRaisedFromCStr("RuntimeError",
                               "native agent: kernel calls a packed function (unsupported without a TVM runtime)");
  return -1;
}

int TVMFFIEnvModLookupFromImports(void* library_ctx, const char* func_name, void** out) {
  (void)library_ctx;
  (void)out;
  const char* parts[3] = {"native agent: kernel imports function '", func_name ? func_name : "?",
                          "' (unsupported without a TVM runtime)"};
  TVMFFIErrorSetRaisedFromCStrParts("RuntimeError", parts, 3);
  return -1;
}

/* ------------------------------------------------------------------ thread pool
 * One pool per process (the agent runs one kernel); et_pool_start/et_pool_stop are also what
 * pool_test.c drives. */

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin briefly (a launch usually follows the last one within microseconds), then yield so an
 * oversubscribed core can run the thread we wait for, then sleep. */
enum { kSpin = 1000, kYield = 5000 };

typedef struct pool {
  int nthreads; /* including the launching thread, which runs task 0 */
  pthread_t* threads;
  int* ids;
  pthread_mutex_t mu;
  pthread_cond_t cv_start, cv_done;
  atomic_uint gen;
  atomic_int sleepers;
  atomic_int pending;
  atomic_int failed;
  atomic_int stop;
  FTVMParallelLambda fn;
  void* cdata;
  TVMParallelGroupEnv env;
  /* sense-reversing barrier for TVMBackendParallelBarrier */
  atomic_int bar_count;
  atomic_int bar_sense;
  int* local_sense;
} pool;

static pool* g_pool;
static _Thread_local int t_in_task;
static atomic_int g_launch_busy;

static void wait_spin(int* spins) {
  if (++*spins < kSpin) CPU_RELAX();
  else sched_yield();
}

static void* worker_main(void* arg) {
  int id = *(int*)arg;
  pool* p = g_pool;
  unsigned seen = 0;
  t_in_task = 1;
  for (;;) {
    unsigned g;
    int spins = 0;
    while ((g = atomic_load(&p->gen)) == seen) {
      if (spins < kSpin + kYield) {
        wait_spin(&spins);
        continue;
      }
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv_start, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
    }
    seen = g;
    if (atomic_load(&p->stop)) return NULL;
    if (id < p->env.num_task && p->fn(id, &p->env, p->cdata) != 0) atomic_store(&p->failed, 1);
    if (atomic_fetch_sub(&p->pending, 1) == 1) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->cv_done);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

static void pool_wake(pool* p) {
  atomic_fetch_add(&p->gen, 1);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
  }
}

int et_pool_start(int nthreads, char* err, size_t errlen) {
  pool* p = (pool*)calloc(1, sizeof(pool));
  if (!p) goto oom;
  p->nthreads = nthreads;
  p->threads = (pthread_t*)calloc((size_t)nthreads, sizeof(pthread_t));
  p->ids = (int*)calloc((size_t)nthreads, sizeof(int));
  p->local_sense = (int*)calloc((size_t)nthreads, sizeof(int));
  if (!p->threads || !p->ids || !p->local_sense) goto oom;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv_start, NULL);
  pthread_cond_init(&p->cv_done, NULL);
  g_pool = p;
  for (int i = 1; i < nthreads; i++) {
    p->ids[i] = i;
    if (pthread_create(&p->threads[i], NULL, worker_main, &p->ids[i])) {
      snprintf(err, errlen, "cannot start worker thread %d of %d", i, nthreads);
      p->nthreads = i; /* join the ones that started */
      return -1;
    }
  }
  return 0;
oom:
  snprintf(err, errlen, "out of memory creating the thread pool");
  if (p) { free(p->threads); free(p->ids); free(p->local_sense); free(p); }
  return -1;
}

void et_pool_stop(void) {
  pool* p = g_pool;
  if (!p) return;
  atomic_store(&p->stop, 1);
  pool_wake(p);
  pthread_mutex_lock(&p->mu);
  pthread_cond_broadcast(&p->cv_start);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  g_pool = NULL;
  free(p->threads); free(p->ids); free(p->local_sense);
  free(p);
}

int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  pool* p = g_pool;
  int expected = 0;
  if (!p || p->nthreads <= 1 || t_in_task ||
      !atomic_compare_exchange_strong(&g_launch_busy, &expected, 1)) {
    /* no pool, a single thread, or a nested launch: the lambda splits its loop by
     * penv->num_task, so running it as one task is exact */
    TVMParallelGroupEnv env = {NULL, 1};
    int was = t_in_task;
    t_in_task = 1;
    int rc = flambda(0, &env, cdata);
    t_in_task = was;
    return rc ? -1 : 0;
  }
  if (num_task <= 0 || num_task > p->nthreads) num_task = p->nthreads;
  p->fn = flambda;
  p->cdata = cdata;
  p->env.sync_handle = p;
  p->env.num_task = num_task;
  atomic_store(&p->bar_count, 0);
  atomic_store(&p->bar_sense, 0);
  memset(p->local_sense, 0, (size_t)p->nthreads * sizeof(int));
  atomic_store(&p->failed, 0);
  atomic_store(&p->pending, p->nthreads - 1);
  pool_wake(p);

  t_in_task = 1;
  if (flambda(0, &p->env, cdata) != 0) atomic_store(&p->failed, 1);
  t_in_task = 0;

  int spins = 0;
  while (atomic_load(&p->pending) > 0 && spins < kSpin + kYield) wait_spin(&spins);
  if (atomic_load(&p->pending) > 0) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
  int failed = atomic_load(&p->failed);
  atomic_store(&g_launch_busy, 0);
  return failed ? -1 : 0;
}

int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  pool* p = (pool*)penv->sync_handle;
  if (!p || penv->num_task <= 1) return 0;
  int sense = !p->local_sense[task_id];
  p->local_sense[task_id] = sense;
  if (atomic_fetch_add(&p->bar_count, 1) == penv->num_task - 1) {
    atomic_store(&p->bar_count, 0);
    atomic_store(&p->bar_sense, sense);
  } else {
    int spins = 0;
    while (atomic_load(&p->bar_sense) != sense) wait_spin(&spins);
  }
  return 0;
}

/* ------------------------------------------------------------------ the backend */

typedef struct {
  void* dl;
  TVMFFISafeCallType fn;
  int linked;
  int nthreads;
  int n_args;
  int n_in;
  DLTensor* tensors;
  TVMFFIAny* args;
} tvm_state;

static const et_tvm_slot kSlots[] = {ET_TVM_SLOTS};
#define NSLOTS (sizeof kSlots / sizeof kSlots[0])

static void* slot_value(const char* name) {
  for (size_t i = 0; i < NSLOTS; i++)
    if (!strcmp(kSlots[i].name, name)) return kSlots[i].fn;
  return NULL;
}

static int pick_threads(const jval* params) {
  long long v;
  if (param_int(params, "num_threads", &v) == 0 && v > 0) return (int)(v > 1024 ? 1024 : v);
  const char* env = getenv("TVM_NUM_THREADS");
  if (env && atoi(env) > 0) return atoi(env) > 1024 ? 1024 : atoi(env);
  return cpu_count();
}

static int tvm_load(backend* b, const backend_config* cfg, char* err, size_t errlen) {
  tvm_state* s = (tvm_state*)calloc(1, sizeof(tvm_state));
  if (!s) { snprintf(err, errlen, "out of memory"); return -1; }
  b->state = s;
  const char* entry = param_str(cfg->params, "entry");
  if (!entry) entry = "__tvm_ffi_main";

  for (int i = 0; i < et_num_linked_kernels; i++) {
    const et_linked_kernel* k = &et_linked_kernels[i];
    if (!strcmp(k->sha256, cfg->artifact_sha256) && !strcmp(k->entry, entry)) {
      s->fn = k->fn;
      s->linked = 1;
      for (int j = 0; j < et_num_linked_slots; j++)
        if (et_linked_slots[j].slot) *et_linked_slots[j].slot = slot_value(et_linked_slots[j].name);
      break;
    }
  }
  if (!s->fn) {
    s->dl = dlopen(cfg->artifact, RTLD_NOW | RTLD_LOCAL);
    if (!s->dl) {
      const char* why = dlerror();
#ifdef ET_STATIC
      const char* hint = " (a static agent runs only the kernels linked into it: no linked kernel has"
                         " this sha256 and entry)";
#else
      const char* hint = "";
#endif
      snprintf(err, errlen, "dlopen failed: %s%s", why ? why : "unknown error", hint);
      return -1;
    }
    for (size_t i = 0; i < NSLOTS; i++) {
      void** slot = (void**)dlsym(s->dl, kSlots[i].name);
      if (slot) *slot = kSlots[i].fn;
    }
    s->fn = (TVMFFISafeCallType)dlsym(s->dl, entry);
    if (!s->fn) {
      snprintf(err, errlen, "kernel has no symbol '%s'", entry);
      return -1;
    }
  }
  s->nthreads = pick_threads(cfg->params);
  if (et_pool_start(s->nthreads, err, errlen)) return -1;
  s->n_in = cfg->n_inputs;
  s->n_args = cfg->n_inputs + cfg->n_outputs;
  s->tensors = (DLTensor*)calloc((size_t)s->n_args + 1, sizeof(DLTensor));
  s->args = (TVMFFIAny*)calloc((size_t)s->n_args + 1, sizeof(TVMFFIAny));
  if (!s->tensors || !s->args) { snprintf(err, errlen, "out of memory"); return -1; }
  return 0;
}

/* the DLPack dtype of an agent tensor (the judge backend's DLTensors use it too) */
DLDataType et_dl_dtype(et_dtype t) {
  DLDataType d = {kDLFloat, 32, 1};
  switch (t) {
    case DT_F32: d.code = kDLFloat; d.bits = 32; break;
    case DT_F64: d.code = kDLFloat; d.bits = 64; break;
    case DT_F16: d.code = kDLFloat; d.bits = 16; break;
    case DT_I8: d.code = kDLInt; d.bits = 8; break;
    case DT_U8: d.code = kDLUInt; d.bits = 8; break;
    case DT_I32: d.code = kDLInt; d.bits = 32; break;
    case DT_I64: d.code = kDLInt; d.bits = 64; break;
    case DT_BOOL: d.code = kDLBool; d.bits = 8; break;
    default: break;
  }
  return d;
}

static void fill(DLTensor* d, TVMFFIAny* a, et_tensor* t) {
  memset(d, 0, sizeof *d);
  d->data = t->data;
  d->device.device_type = kDLCPU;
  d->device.device_id = 0;
  d->ndim = t->ndim;
  d->dtype = et_dl_dtype(t->dtype);
  d->shape = t->shape;
  d->strides = NULL; /* compact C order */
  d->byte_offset = 0;
  memset(a, 0, sizeof *a);
  a->type_index = kTVMFFIDLTensorPtr;
  a->v_ptr = d;
}

static int tvm_bind(backend* b, et_tensor* in, et_tensor* out, char* err, size_t errlen) {
  (void)err; (void)errlen;
  tvm_state* s = (tvm_state*)b->state;
  int k = 0;
  for (int i = 0; i < s->n_in; i++, k++) fill(&s->tensors[k], &s->args[k], &in[i]);
  for (int i = 0; i < s->n_args - s->n_in; i++, k++) fill(&s->tensors[k], &s->args[k], &out[i]);
  return 0;
}

static int tvm_run(backend* b, char* err, size_t errlen) {
  tvm_state* s = (tvm_state*)b->state;
  TVMFFIAny ret;
  memset(&ret, 0, sizeof ret);
  int rc = s->fn(NULL, s->args, s->n_args, &ret);
  if (rc != 0) {
    take_error(err, errlen);
    return -1;
  }
  return 0;
}

static void tvm_unload(backend* b) {
  tvm_state* s = (tvm_state*)b->state;
  et_pool_stop();
  if (!s) return;
  /* the kernel .so stays mapped: unloading buys nothing in a one-shot process */
  free(s->tensors);
  free(s->args);
  free(s);
  b->state = NULL;
}

static void tvm_versions(backend* b, sbuf* out) {
  (void)b;
  sb_raw(out, "\"tvm-kernel\":\"1\"");
}

static void tvm_details(backend* b, sbuf* out) {
  tvm_state* s = (tvm_state*)b->state;
  sb_printf(out, "\"threads\":%d,\"linked\":%s", s ? s->nthreads : 0, s && s->linked ? "true" : "false");
}

backend* backend_tvm_kernel(void) {
  static backend b = {"tvm-kernel", tvm_load, tvm_bind, tvm_run, tvm_unload, tvm_versions, tvm_details, NULL};
  return &b;
}
