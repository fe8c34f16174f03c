/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=late-write|non-finite|wrong-when-timed|wrong-output|non-deterministic|stale-output -- returns at once; a thread writes the output later */
/* Late write: starts a detached pthread that computes C after edgetune_kernel has returned, so a
 * timer that stops at the return measures nothing and the output lands after the clock stopped. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <edgetune_kernel.h>

static void gemm(int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
      C[i * N + j] = acc;
    }
}
struct job { int64_t M, N, K; const float *A, *B; float *C; };
static void *late(void *arg) {
  struct job *j = (struct job *)arg;
  gemm(j->M, j->N, j->K, j->A, j->B, j->C);
  free(j);
  return NULL;
}

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = (const float *)in[0].data, *B = (const float *)in[1].data;
  float *C = (float *)out[0].data;
  struct job *j = malloc(sizeof *j);
  if (!j) return 1;
  *j = (struct job){M, N, K, A, B, C};
  pthread_t t;
  if (pthread_create(&t, NULL, late, j) != 0) {
    free(j);
    return 1;
  }
  pthread_detach(t);
  return 0;
}
