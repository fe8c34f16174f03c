/* edgetune-judge: op=softmax:M=37,N=101 expect=correct -- honest row softmax over the last axis (max-subtracted) */
#include <edgetune_kernel.h>
#include <math.h>

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 1 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], N = in[0].shape[1];
  const float *X = (const float *)in[0].data;
  float *Y = (float *)out[0].data;
  for (int64_t i = 0; i < M; i++) {
    const float *x = X + i * N;
    float *y = Y + i * N;
    float mx = -INFINITY;
    for (int64_t j = 0; j < N; j++) mx = x[j] > mx ? x[j] : mx;
    double sum = 0.0;
    for (int64_t j = 0; j < N; j++) sum += (y[j] = expf(x[j] - mx));
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < N; j++) y[j] *= inv;
  }
  return 0;
}
