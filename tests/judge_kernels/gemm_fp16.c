/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=imprecise|wrong-output -- rounds inputs and output to bfloat16 (8-bit mantissa) */
/* Lowered precision: every A, B element and every output is rounded to bfloat16 (round to
 * nearest even), what an fp16/bf16 kernel passed off as fp32 computes. */
#include <edgetune_kernel.h>
#include <string.h>

static float bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = (const float *)in[0].data, *B = (const float *)in[1].data;
  float *C = (float *)out[0].data;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; k++) acc += bf16(A[i * K + k]) * bf16(B[k * N + j]);
      C[i * N + j] = bf16(acc);
    }
  return 0;
}
