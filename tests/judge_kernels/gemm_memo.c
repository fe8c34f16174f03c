/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=correct|caching -- memoizes on a hash of the inputs */
/* Caching: hashes A and B (FNV-1a, O(MK + KN)); on the same hash as the last call it copies the
 * remembered output instead of computing. Always correct on distinct inputs, and faster only when
 * an input repeats, which fresh inputs for every timed call defeat. */
#include <stdlib.h>
#include <string.h>
#include <edgetune_kernel.h>

static void gemm(int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
      C[i * N + j] = acc;
    }
}
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static uint64_t last_hash;
static float *memo;
static int64_t memo_n = -1;

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = (const float *)in[0].data, *B = (const float *)in[1].data;
  float *C = (float *)out[0].data;
  uint64_t h = fnv(fnv(14695981039346656037ull, A, (size_t)(M * K) * 4), B, (size_t)(K * N) * 4);
  if (memo && memo_n == M * N && h == last_hash) {
    memcpy(C, memo, (size_t)(M * N) * sizeof(float));
    return 0;
  }
  gemm(M, N, K, A, B, C);
  free(memo);
  memo = malloc((size_t)(M * N) * sizeof(float));
  if (memo) memcpy(memo, C, (size_t)(M * N) * sizeof(float));
  memo_n = M * N;
  last_hash = h;
  return 0;
}
