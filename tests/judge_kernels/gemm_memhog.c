/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=out-of-memory|kernel-error -- allocates and touches 8 GiB */
/* Memory hog: mallocs 8 GiB and writes one byte per 4 KiB page (so it is really resident), then
 * computes honestly. Under the judge's memory limit the allocation or the touching fails.
 * When malloc refuses, it returns 12 (ENOMEM) instead of computing. */
#define _GNU_SOURCE
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

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = (const float *)in[0].data, *B = (const float *)in[1].data;
  float *C = (float *)out[0].data;
  const size_t size = (size_t)8 << 30;
  volatile char *p = malloc(size);
  if (!p) return 12;
  for (size_t off = 0; off < size; off += 4096) p[off] = 1;
  free((void *)p);
  gemm(M, N, K, A, B, C);
  return 0;
}
