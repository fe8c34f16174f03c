/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=input-mutated -- uses the input A as scratch space */
/* Input mutation: computes C honestly, then overwrites A (casting away const) as scratch.
 * On the device the inputs are mapped read-only, so the write faults. */

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
  gemm(M, N, K, A, B, C);
  float *scratch = (float *)A;
  for (int64_t i = 0; i < M * K; i++) scratch[i] = 0.0f;
  return 0;
}
