/* edgetune-judge: op=layernorm:M=37,N=101 expect=correct -- honest layernorm over the last axis (eps 1e-5, population variance) */
#include <edgetune_kernel.h>
#include <math.h>

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 3 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], N = in[0].shape[1];
  const float *X = (const float *)in[0].data, *gamma = (const float *)in[1].data, *beta = (const float *)in[2].data;
  float *Y = (float *)out[0].data;
  for (int64_t i = 0; i < M; i++) {
    const float *x = X + i * N;
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < N; j++) mean += x[j];
    mean /= (double)N;
    for (int64_t j = 0; j < N; j++) var += (x[j] - mean) * (x[j] - mean);
    var /= (double)N;
    const double rstd = 1.0 / sqrt(var + 1e-5);
    for (int64_t j = 0; j < N; j++) Y[i * N + j] = (float)((x[j] - mean) * rstd * gamma[j] + beta[j]);
  }
  return 0;
}
