/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=wrong-output|non-finite -- correct only when M, N, K are multiples of 8 (remainders ignored) */
/* Buggy: every loop runs to the size rounded down to a multiple of 8; leftover rows, columns and
 * k are never computed (what a kernel tuned on 256x256 only looks like). */
#include <edgetune_kernel.h>

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = (const float *)in[0].data, *B = (const float *)in[1].data;
  float *C = (float *)out[0].data;
  const int64_t M8 = M & ~(int64_t)7, N8 = N & ~(int64_t)7, K8 = K & ~(int64_t)7;
  for (int64_t i = 0; i < M8; i++)
    for (int64_t j = 0; j < N8; j++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K8; k++) acc += A[i * K + k] * B[k * N + j];
      C[i * N + j] = acc;
    }
  return 0;
}
