/* libedgetune-ortop: an onnxruntime custom-op library that runs TVM-exported kernels inside an
 * onnxruntime graph, with no TVM runtime on the device (the hybrid onnxruntime + TVM candidates,
 * edgetune/space/ort_tvm.py).
 *
 * The host rewrites a model: a node (or a node and the activation after it) that a
 * MetaSchedule-tuned kernel runs faster becomes
 *
 *     ai.edgetune::TvmKernel(X, W[, B]) -> Y
 *       kernel    = "k-<sha256>.so"            the kernel, a file next to this library
 *       in_shapes = "1,72,56,56;72,1,3,3;72"   the shapes it was compiled for, one per input
 *       out_shape = "1,72,56,56"
 *
 * and the candidate registers this library with its session. Each kernel is dlopen'ed once per
 * node; its entry `__tvm_ffi_main` takes DLTensor* arguments (inputs, then the output). The hooks
 * an exported kernel needs from a TVM runtime are defined here (as in tvm_backend.c): errors,
 * workspace, and parallel launches, which run on onnxruntime's own intra-op thread pool
 * (KernelContext_ParallelFor) so that the kernel and the rest of the graph share one pool
 * instead of two pools of spinning threads fighting over the cores.
 *
 * A tensor of another shape than the kernel was compiled for is an error of the run (the
 * candidate's failure), never a silent wrong answer. */
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

#include "ort_abi.h"
#include "tvm_abi.h"

#define ET_EXPORT __attribute__((visibility("default")))

static const OrtApi* g_api;
#define API(name, type) ORT_FN(g_api, ORT_##name, type)

/* ------------------------------------------------------------------ kernel hooks */

static __thread char t_err[512]; /* the kernel's last error, per thread */

ET_EXPORT void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t off = (size_t)snprintf(t_err, sizeof t_err, "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < n && off < sizeof t_err; i++)
    off += (size_t)snprintf(t_err + off, sizeof t_err - off, "%s", parts[i] ? parts[i] : "");
}

ET_EXPORT void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  TVMFFIErrorSetRaisedFromCStrParts(kind, &message, 1);
}

ET_EXPORT void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                                         int dtype_code_hint, int dtype_bits_hint) {
  (void)device_id; (void)dtype_code_hint; (void)dtype_bits_hint;
  void* p = NULL;
  if (device_type != kDLCPU) {
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", "edgetune ortop: workspace requested for a non-CPU device");
    return NULL;
  }
  if (posix_memalign(&p, 64, nbytes ? (size_t)nbytes : 1)) { /* 64: TVM's kTempAllocaAlignment */
    TVMFFIErrorSetRaisedFromCStr("MemoryError", "edgetune ortop: workspace allocation failed");
    return NULL;
  }
  return p;
}

ET_EXPORT int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type; (void)device_id;
  free(ptr);
  return 0;
}

static pthread_mutex_t g_once_mu = PTHREAD_MUTEX_INITIALIZER;

ET_EXPORT int TVMFFIHandleInitOnce(void** handle_addr, int (*init_func)(void** result)) {
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

ET_EXPORT int TVMFFIFunctionCall(void* func, TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)func; (void)args; (void)num_args; (void)result;
  TVMFFIErrorSetRaisedFromCStr("RuntimeError", "edgetune ortop: kernel calls a packed function (no TVM runtime)");
  return -1;
}

ET_EXPORT int TVMFFIEnvModLookupFromImports(void* library_ctx, const char* func_name, void** out) {
  (void)library_ctx; (void)out;
  const char* parts[3] = {"edgetune ortop: kernel imports function '", func_name ? func_name : "?",
                          "' (no TVM runtime)"};
  TVMFFIErrorSetRaisedFromCStrParts("RuntimeError", parts, 3);
  return -1;
}

/* Parallel launches: the kernel's lambda splits its loop by penv->num_task; the tasks run on
 * onnxruntime's pool. onnxruntime may run several tasks on one thread one after the other, so a
 * barrier between tasks could wait forever: it is refused (an error of the run). */
static __thread const OrtKernelContext* t_ctx; /* the node being computed on this thread */
static __thread int t_in_task;
static int g_tasks = 1;

typedef struct {
  FTVMParallelLambda fn;
  void* cdata;
  int num_task;
  atomic_int failed;
} par_job;

static void par_body(void* data, size_t i) {
  par_job* j = (par_job*)data;
  TVMParallelGroupEnv env = {NULL, j->num_task};
  int was = t_in_task;
  t_in_task = 1;
  if (j->fn((int)i, &env, j->cdata) != 0) atomic_store(&j->failed, 1);
  t_in_task = was;
}

ET_EXPORT int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  int n = num_task > 0 ? num_task : g_tasks;
  if (t_in_task || !t_ctx || n <= 1) {
    TVMParallelGroupEnv env = {NULL, 1};
    int was = t_in_task;
    t_in_task = 1;
    int rc = flambda(0, &env, cdata);
    t_in_task = was;
    return rc ? -1 : 0;
  }
  par_job j;
  j.fn = flambda;
  j.cdata = cdata;
  j.num_task = n;
  atomic_init(&j.failed, 0);
  OrtStatus* st = API(KernelContext_ParallelFor, OrtParallelForFn)(t_ctx, par_body, (size_t)n, (size_t)n, &j);
  if (st) {
    snprintf(t_err, sizeof t_err, "edgetune ortop: KernelContext_ParallelFor failed: %s",
             API(GetErrorMessage, OrtGetErrorMessageFn)(st));
    API(ReleaseStatus, OrtReleaseFn)(st);
    return -1;
  }
  return atomic_load(&j.failed) ? -1 : 0;
}

ET_EXPORT int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  if (penv->num_task <= 1) return 0;
  TVMFFIErrorSetRaisedFromCStr("RuntimeError",
                               "edgetune ortop: the kernel uses a parallel barrier (unsupported on onnxruntime's pool)");
  return -1;
}

static const et_tvm_slot kSlots[] = {ET_TVM_SLOTS};

/* ------------------------------------------------------------------ the custom op */

enum { kMaxIn = 3, kMaxDims = 6 };

typedef struct {
  TVMFFISafeCallType fn;
  int n_in;
  int in_ndim[kMaxIn];
  int64_t in_shape[kMaxIn][kMaxDims];
  int out_ndim;
  int64_t out_shape[kMaxDims];
  char name[256];
} et_kernel;

static OrtStatus* fail(int code, const char* fmt, const char* a, const char* b) {
  char msg[768];
  snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
  return API(CreateStatus, OrtCreateStatusFn)(code, msg);
}

static OrtStatus* get_attr(const OrtKernelInfo* info, const char* name, char* out, size_t cap) {
  size_t size = cap;
  OrtStatus* st = API(KernelInfoGetAttribute_string, OrtKernelInfoGetAttributeStringFn)(info, name, out, &size);
  if (st) {
    API(ReleaseStatus, OrtReleaseFn)(st);
    return fail(ORT_INVALID_ARGUMENT, "ai.edgetune::TvmKernel: attribute '%s' missing or longer than allowed%s",
                name, NULL);
  }
  return NULL;
}

/* "1,72,56,56" -> dims; -1 on a malformed list */
static int parse_dims(const char* s, int64_t* dims) {
  int n = 0;
  while (*s) {
    char* end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 1 || n == kMaxDims) return -1;
    dims[n++] = v;
    s = end;
    if (*s == ',') s++;
    else if (*s) return -1;
  }
  return n ? n : -1;
}

static int lib_dir(char* out, size_t cap) {
  Dl_info di;
  if (!dladdr((void*)&lib_dir, &di) || !di.dli_fname) return -1;
  const char* slash = strrchr(di.dli_fname, '/');
  size_t len = slash ? (size_t)(slash - di.dli_fname) : 1;
  if (len + 1 > cap) return -1;
  if (slash) memcpy(out, di.dli_fname, len);
  else out[0] = '.';
  out[len] = 0;
  /* onnxruntime dlopens this library RTLD_LOCAL: make the hooks above visible to the kernels,
   * which reach some of them as undefined symbols */
  if (!dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) return -1;
  return 0;
}

static OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                void** kernel) {
  (void)op; (void)api;
  char file[256], ins[512], outs[128], dir[1024], path[1400];
  OrtStatus* st;
  if ((st = get_attr(info, "kernel", file, sizeof file))) return st;
  if ((st = get_attr(info, "in_shapes", ins, sizeof ins))) return st;
  if ((st = get_attr(info, "out_shape", outs, sizeof outs))) return st;
  if (!file[0] || strchr(file, '/') || file[0] == '.')
    return fail(ORT_INVALID_ARGUMENT, "ai.edgetune::TvmKernel: kernel '%s' is not a file name next to the library%s",
                file, NULL);
  et_kernel* k = (et_kernel*)calloc(1, sizeof(et_kernel));
  if (!k) return fail(ORT_FAIL, "ai.edgetune::TvmKernel: out of memory%s%s", NULL, NULL);
  snprintf(k->name, sizeof k->name, "%s", file);
  char* save = NULL;
  for (char* tok = strtok_r(ins, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
    if (k->n_in == kMaxIn || (k->in_ndim[k->n_in] = parse_dims(tok, k->in_shape[k->n_in])) < 0) {
      free(k);
      return fail(ORT_INVALID_ARGUMENT, "ai.edgetune::TvmKernel %s: bad in_shapes%s", file, NULL);
    }
    k->n_in++;
  }
  if (k->n_in < 1 || (k->out_ndim = parse_dims(outs, k->out_shape)) < 0) {
    free(k);
    return fail(ORT_INVALID_ARGUMENT, "ai.edgetune::TvmKernel %s: bad in_shapes or out_shape%s", file, NULL);
  }
  if (lib_dir(dir, sizeof dir)) {
    free(k);
    return fail(ORT_FAIL, "ai.edgetune::TvmKernel %s: cannot locate the custom-op library%s", file, NULL);
  }
  snprintf(path, sizeof path, "%s/%s", dir, file);
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* why = dlerror();
    free(k);
    return fail(ORT_FAIL, "ai.edgetune::TvmKernel: dlopen failed: %s%s", why ? why : path, NULL);
  }
  for (size_t i = 0; i < sizeof kSlots / sizeof kSlots[0]; i++) {
    void** slot = (void**)dlsym(dl, kSlots[i].name);
    if (slot) *slot = kSlots[i].fn;
  }
  k->fn = (TVMFFISafeCallType)dlsym(dl, "__tvm_ffi_main");
  if (!k->fn) {
    free(k);
    return fail(ORT_FAIL, "ai.edgetune::TvmKernel: %s has no __tvm_ffi_main%s", file, NULL);
  }
  *kernel = k; /* the .so stays mapped for the life of the process: kernels are small */
  return NULL;
}

static OrtStatus* shape_of(const OrtValue* v, int64_t* dims, size_t* ndim, int* elem) {
  OrtTensorTypeAndShapeInfo* ti = NULL;
  OrtStatus* st = API(GetTensorTypeAndShape, OrtGetTensorTypeAndShapeFn)(v, &ti);
  if (st) return st;
  if (!(st = API(GetTensorElementType, OrtGetTensorElementTypeFn)(ti, elem)) &&
      !(st = API(GetDimensionsCount, OrtGetDimensionsCountFn)(ti, ndim))) {
    if (*ndim > kMaxDims) *ndim = kMaxDims + 1;
    else st = API(GetDimensions, OrtGetDimensionsFn)(ti, dims, *ndim);
  }
  API(ReleaseTensorTypeAndShapeInfo, OrtReleaseFn)(ti);
  return st;
}

static void dims_text(const int64_t* d, size_t n, char* out, size_t cap) {
  size_t off = 0;
  out[0] = 0;
  for (size_t i = 0; i < n && off < cap; i++)
    off += (size_t)snprintf(out + off, cap - off, i ? ",%lld" : "%lld", (long long)d[i]);
}

static OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  et_kernel* k = (et_kernel*)kernel;
  DLTensor t[kMaxIn + 1];
  TVMFFIAny args[kMaxIn + 1];
  size_t count = 0;
  OrtStatus* st = API(KernelContext_GetInputCount, OrtKernelContextCountFn)(ctx, &count);
  if (st) return st;
  int n = 0;
  for (size_t i = 0; i < count && i < kMaxIn; i++) {
    const OrtValue* v = NULL;
    if ((st = API(KernelContext_GetInput, OrtKernelContextGetInputFn)(ctx, i, &v))) return st;
    if (!v) continue; /* an absent optional input */
    int64_t dims[kMaxDims];
    size_t nd = 0;
    int elem = 0;
    if ((st = shape_of(v, dims, &nd, &elem))) return st;
    char got[160];
    dims_text(dims, nd > kMaxDims ? 0 : nd, got, sizeof got);
    if (elem != ONNX_FLOAT)
      return fail(ORT_INVALID_ARGUMENT, "ai.edgetune::TvmKernel %s: input is not float32%s", k->name, NULL);
    if (n >= k->n_in || (int)nd != k->in_ndim[n] || memcmp(dims, k->in_shape[n], nd * sizeof(int64_t)))
      return fail(ORT_INVALID_ARGUMENT, "ai.edgetune::TvmKernel %s: input of shape [%s] is not the shape the kernel"
                  " was compiled for", k->name, got);
    void* data = NULL;
    if ((st = API(GetTensorMutableData, OrtGetTensorMutableDataFn)((OrtValue*)v, &data))) return st;
    memset(&t[n], 0, sizeof t[n]);
    t[n].data = data;
    t[n].device.device_type = kDLCPU;
    t[n].ndim = (int32_t)nd;
    t[n].dtype.code = kDLFloat;
    t[n].dtype.bits = 32;
    t[n].dtype.lanes = 1;
    t[n].shape = k->in_shape[n];
    n++;
  }
  if (n != k->n_in)
    return fail(ORT_INVALID_ARGUMENT, "ai.edgetune::TvmKernel %s: wrong number of inputs%s", k->name, NULL);
  OrtValue* out = NULL;
  if ((st = API(KernelContext_GetOutput, OrtKernelContextGetOutputFn)(ctx, 0, k->out_shape, (size_t)k->out_ndim,
                                                                       &out)))
    return st;
  void* odata = NULL;
  if ((st = API(GetTensorMutableData, OrtGetTensorMutableDataFn)(out, &odata))) return st;
  memset(&t[n], 0, sizeof t[n]);
  t[n].data = odata;
  t[n].device.device_type = kDLCPU;
  t[n].ndim = k->out_ndim;
  t[n].dtype.code = kDLFloat;
  t[n].dtype.bits = 32;
  t[n].dtype.lanes = 1;
  t[n].shape = k->out_shape;
  for (int i = 0; i <= n; i++) {
    memset(&args[i], 0, sizeof args[i]);
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &t[i];
  }
  TVMFFIAny ret;
  memset(&ret, 0, sizeof ret);
  const OrtKernelContext* was = t_ctx;
  t_ctx = ctx;
  t_err[0] = 0;
  int rc = k->fn(NULL, args, n + 1, &ret);
  t_ctx = was;
  if (rc != 0)
    return fail(ORT_RUNTIME_EXCEPTION, "ai.edgetune::TvmKernel %s: %s", k->name,
                t_err[0] ? t_err : "kernel returned an error without a message");
  return NULL;
}

static void destroy(void* kernel) { free(kernel); }
static const char* op_name(const OrtCustomOp* op) { (void)op; return "TvmKernel"; }
static const char* op_ep(const OrtCustomOp* op) { (void)op; return NULL; /* the CPU provider */ }
static int op_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return ONNX_FLOAT; }
static size_t op_in_count(const OrtCustomOp* op) { (void)op; return kMaxIn; }
static size_t op_out_count(const OrtCustomOp* op) { (void)op; return 1; }
static int op_in_char(const OrtCustomOp* op, size_t i) {
  (void)op;
  return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
static int op_out_char(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return INPUT_OUTPUT_REQUIRED; }
static int op_mem(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }
static int op_zero(const OrtCustomOp* op) { (void)op; return 0; }
static int op_one(const OrtCustomOp* op) { (void)op; return 1; }

static OrtCustomOp g_op;
static OrtCustomOpDomain* g_domain;
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;

ET_EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  pthread_mutex_lock(&g_reg_mu);
  if (!g_api) {
    g_api = base->GetApi(ET_ORT_API_VERSION);
    if (!g_api) {
      pthread_mutex_unlock(&g_reg_mu);
      /* without an OrtApi there is no way to make a status: onnxruntime reports a null
       * status as success, so fail loudly in the only way left */
      fprintf(stderr, "edgetune ortop: onnxruntime %s lacks C API version %d\n", base->GetVersionString(),
              ET_ORT_API_VERSION);
      abort();
    }
    memset(&g_op, 0, sizeof g_op);
    g_op.version = ET_CUSTOM_OP_VERSION;
    g_op.GetName = op_name;
    g_op.GetExecutionProviderType = op_ep;
    g_op.GetInputType = op_type;
    g_op.GetInputTypeCount = op_in_count;
    g_op.GetOutputType = op_type;
    g_op.GetOutputTypeCount = op_out_count;
    g_op.KernelDestroy = destroy;
    g_op.GetInputCharacteristic = op_in_char;
    g_op.GetOutputCharacteristic = op_out_char;
    g_op.GetInputMemoryType = op_mem;
    g_op.GetVariadicInputMinArity = op_one;
    g_op.GetVariadicInputHomogeneity = op_one;
    g_op.GetVariadicOutputMinArity = op_one;
    g_op.GetVariadicOutputHomogeneity = op_one;
    g_op.CreateKernelV2 = create_kernel;
    g_op.KernelComputeV2 = compute;
    (void)op_zero;
    long cpus = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
#endif
    g_tasks = cpus > 0 ? (int)(cpus > 256 ? 256 : cpus) : 1;
  }
  OrtStatus* st = NULL;
  if (!g_domain) {
    st = API(CreateCustomOpDomain, OrtCreateCustomOpDomainFn)("ai.edgetune", &g_domain);
    if (!st) st = API(CustomOpDomain_Add, OrtCustomOpDomainAddFn)(g_domain, &g_op);
  }
  if (!st) st = API(AddCustomOpDomain, OrtAddCustomOpDomainFn)(options, g_domain);
  pthread_mutex_unlock(&g_reg_mu);
  return st;
}
