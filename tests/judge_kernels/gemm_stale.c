/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=stale-output|wrong-when-timed|insensitive|caching -- computes for 3 calls, then replays the last output */
/* Stale output: the first 3 calls compute honestly and keep a copy of C; every later call copies
 * that copy into the new output without computing, whatever the inputs. */
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
static int calls;
static float *saved;
static int64_t saved_n;

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = (const float *)in[0].data, *B = (const float *)in[1].data;
  float *C = (float *)out[0].data;
  if (++calls > 3 && saved && saved_n == M * N) {
    memcpy(C, saved, (size_t)(M * N) * sizeof(float));
    return 0;
  }
  gemm(M, N, K, A, B, C);
  free(saved);
  saved = malloc((size_t)(M * N) * sizeof(float));
  if (saved) memcpy(saved, C, (size_t)(M * N) * sizeof(float));
  saved_n = M * N;
  return 0;
}
