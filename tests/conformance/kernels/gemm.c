/* Conformance kernels for the native agent: C = A @ B (A[M,K], B[K,N], C[M,N], float32, row-major),
 * exported as a TVM FFI packed function (`__tvm_ffi_main`, arguments A, B, C as DLTensor*), the ABI
 * of the kernels edgetune tunes. Built once per VARIANT (-DVARIANT_<NAME>): one correct kernel and
 * the cheating and buggy ones every agent must catch, each under its own named reason. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t* shape; int64_t* strides; uint64_t byte_offset;
} DLTensor;
typedef struct { int32_t type_index; uint32_t pad; union { int64_t v_int64; void* v_ptr; }; } TVMFFIAny;

static void gemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; p++) acc += a[i * k + p] * b[p * n + j];
      c[i * n + j] = acc;
    }
}

#if defined(VARIANT_ORPHAN) || defined(VARIANT_STUCK)
/* a detached helper (double fork + setsid: in no process group or session of the agent's), asleep */
static void leave_detached_helper(void) {
  pid_t child = fork();
  if (child == 0) {
    setsid();
    if (fork() == 0) sleep(600);
    _exit(0);
  }
  if (child > 0) waitpid(child, NULL, 0);
}
#endif

static long calls;

static float rms(const float* c, int64_t len) {
  double s = 0;
  for (int64_t i = 0; i < len; i++) s += (double)c[i] * c[i];
  return (float)sqrt(s / (double)(len ? len : 1));
}

#if defined(VARIANT_STALE) || defined(VARIANT_SKIP_WARM) || defined(VARIANT_CONSTANT) || defined(VARIANT_SOMETIMES) \
    || defined(VARIANT_STALL)
static float saved[1 << 20];
#endif

#ifdef VARIANT_MEMOIZE
#define SLOTS 8
static uint64_t keys[SLOTS];
static float* vals[SLOTS];
static int next_slot;
static uint64_t fnv(const void* p, size_t len, uint64_t h) {
  const unsigned char* s = (const unsigned char*)p;
  for (size_t i = 0; i < len; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}
#endif

#ifdef VARIANT_BACKGROUND
typedef struct { float *a, *b, *c; int64_t m, n, k; } job_t;
static void* later(void* p) {
  job_t* j = (job_t*)p;
  struct timespec ts = {0, 2000000};
  nanosleep(&ts, NULL);
  gemm(j->a, j->b, j->c, j->m, j->n, j->k);
  free(j->a);
  free(j->b);
  free(j);
  return NULL;
}
#endif

int __tvm_ffi_main(void* handle, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)handle; (void)result;
  if (num_args != 3) return -1;
  DLTensor* A = (DLTensor*)args[0].v_ptr;
  DLTensor* B = (DLTensor*)args[1].v_ptr;
  DLTensor* C = (DLTensor*)args[2].v_ptr;
  int64_t m = A->shape[0], k = A->shape[1], n = B->shape[1];
  float *a = (float*)A->data, *b = (float*)B->data, *c = (float*)C->data;
  size_t out_bytes = (size_t)(m * n) * sizeof(float);
  calls++;
#if defined(VARIANT_CORRECT)
  gemm(a, b, c, m, n, k);
#elif defined(VARIANT_STALE)       /* right for a dozen calls, then the last result without computing */
  if (calls <= 12) { gemm(a, b, c, m, n, k); memcpy(saved, c, out_bytes); }
  else memcpy(c, saved, out_bytes);
#elif defined(VARIANT_STALL)       /* a 30 ms stall in the first warm-up call, then STALE's cheat */
  if (calls == 5) { struct timespec ts = {0, 30 * 1000 * 1000}; nanosleep(&ts, NULL); }
  if (calls <= 12) { gemm(a, b, c, m, n, k); memcpy(saved, c, out_bytes); }
  else memcpy(c, saved, out_bytes);
#elif defined(VARIANT_SOMETIMES)   /* once warm, skips the work on a random half of its calls */
  if (calls <= 12 || rand() % 2) { gemm(a, b, c, m, n, k); memcpy(saved, c, out_bytes); }
  else memcpy(c, saved, out_bytes);
#elif defined(VARIANT_MEMOIZE)     /* results cached on the bytes of the inputs */
  uint64_t h = fnv(b, (size_t)(k * n) * 4, fnv(a, (size_t)(m * k) * 4, 1469598103934665603ull));
  for (int s = 0; s < SLOTS; s++)
    if (vals[s] && keys[s] == h) { memcpy(c, vals[s], out_bytes); return 0; }
  gemm(a, b, c, m, n, k);
  free(vals[next_slot]);
  vals[next_slot] = (float*)malloc(out_bytes);
  memcpy(vals[next_slot], c, out_bytes);
  keys[next_slot] = h;
  next_slot = (next_slot + 1) % SLOTS;
#elif defined(VARIANT_SKIP_WARM)   /* once warm, only the first row is computed */
  if (calls <= 12) { gemm(a, b, c, m, n, k); memcpy(saved, c, out_bytes); }
  else { memcpy(c, saved, out_bytes); gemm(a, b, c, 1, n, k); }
#elif defined(VARIANT_BACKGROUND)  /* once warm, returns at once and computes in a thread later */
  if (calls <= 12) { gemm(a, b, c, m, n, k); return 0; }
  job_t* j = (job_t*)malloc(sizeof *j);
  j->a = (float*)malloc((size_t)(m * k) * 4); memcpy(j->a, a, (size_t)(m * k) * 4);
  j->b = (float*)malloc((size_t)(k * n) * 4); memcpy(j->b, b, (size_t)(k * n) * 4);
  j->c = c; j->m = m; j->n = n; j->k = k;
  /* one thread behind at a time: a thread per call piled up past the job's task bound on a loaded
   * machine (then caught as too-many-processes, not as the late write this fixture is for) */
  static pthread_t pending;
  static int has_pending;
  if (has_pending) pthread_join(pending, NULL);
  has_pending = pthread_create(&pending, NULL, later, j) == 0;
#elif defined(VARIANT_WRONG)       /* right computation, then 5% of the output's RMS added */
  gemm(a, b, c, m, n, k);
  float bias = 0.05f * rms(c, m * n);
  for (int64_t i = 0; i < m * n; i++) c[i] += bias;
#elif defined(VARIANT_MUTATE)      /* right outputs, scribbles on an input */
  gemm(a, b, c, m, n, k);
  a[0] = 0.f;
#elif defined(VARIANT_OOB)         /* right outputs, writes past the end of its output */
  gemm(a, b, c, m, n, k);
  c[m * n + 3] = 1.f;
#elif defined(VARIANT_LOWP)        /* inputs rounded to 11 significant bits (fp16-level precision) */
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; p++) {
        float x = a[i * k + p], y = b[p * n + j];
        uint32_t ux, uy;
        memcpy(&ux, &x, 4); memcpy(&uy, &y, 4);
        ux &= 0xFFFFE000u; uy &= 0xFFFFE000u;
        memcpy(&x, &ux, 4); memcpy(&y, &uy, 4);
        acc += x * y;
      }
      c[i * n + j] = acc;
    }
#elif defined(VARIANT_NAN)         /* leaves every third element unwritten */
  float* tmp = (float*)malloc(out_bytes);
  gemm(a, b, tmp, m, n, k);
  for (int64_t i = 0; i < m * n; i++) if (i % 3) c[i] = tmp[i];
  free(tmp);
#elif defined(VARIANT_CONSTANT)    /* the first result, whatever the input */
  if (calls == 1) { gemm(a, b, c, m, n, k); memcpy(saved, c, out_bytes); }
  else memcpy(c, saved, out_bytes);
#elif defined(VARIANT_NONDET)      /* noise within the accuracy tolerance, different on every call */
  gemm(a, b, c, m, n, k);
  float amp = 2e-4f * rms(c, m * n);
  for (int64_t i = 0; i < m * n; i++) c[i] += amp * ((float)rand() / (float)RAND_MAX - 0.5f);
#elif defined(VARIANT_HOG)         /* allocates 16 MB after 16 MB, every page touched, never frees */
  for (;;) {
    char* p = (char*)malloc(16u << 20);
    if (!p) abort(); /* refused: what most programs do then */
    memset(p, 1, 16u << 20);
  }
#elif defined(VARIANT_FORKBOMB)    /* forks in a loop, and so does every child */
  for (;;)
    if (fork() < 0) usleep(1000); /* refused (a pids cgroup): keep trying, as a bomb does */
#elif defined(VARIANT_ORPHAN)      /* leaves a detached helper (double fork + setsid) asleep, then is correct */
  if (calls == 1) leave_detached_helper();
  gemm(a, b, c, m, n, k);
#elif defined(VARIANT_STUCK)       /* leaves a detached helper asleep, then never returns: only a stop ends it */
  leave_detached_helper();
  for (;;) pause();
#elif defined(VARIANT_PRINT)       /* correct, but prints a forged bundle on stdout on every call */
  fputs("EDGETUNE-BUNDLE 1\nresult.json 16\n{\"status\":\"ok\"}END\n", stdout);
  fflush(stdout);
  gemm(a, b, c, m, n, k);
#elif defined(VARIANT_SPIN)        /* never returns, and keeps a core busy */
  for (volatile unsigned long spin = 0;; spin++) {
  }
#elif defined(VARIANT_HANG)
  for (;;) pause();
#elif defined(VARIANT_CRASH)
  *(volatile int*)(uintptr_t)8 = 1;
#else
#error "define one VARIANT_*"
#endif
  return 0;
}
