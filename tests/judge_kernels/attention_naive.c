/* edgetune-judge: op=attention:B=2,H=3,S=17,D=24,L=29 expect=correct -- honest attention softmax(Q K^T / sqrt(D)) V, L may differ from S */
/* The ABI carries no attributes, so causality is fixed when the kernel is compiled:
 * -DEDGETUNE_ATTENTION_CAUSAL=1 (or attention_causal_naive.c) masks key j > i + (L - S).
 * A query row whose keys are all masked (only when L < S) gets zeros. */
#include <edgetune_kernel.h>
#include <math.h>

#ifndef EDGETUNE_ATTENTION_CAUSAL
#define EDGETUNE_ATTENTION_CAUSAL 0
#endif

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 3 || n_out != 1) return 1;
  const int64_t B = in[0].shape[0], H = in[0].shape[1], S = in[0].shape[2], D = in[0].shape[3];
  const int64_t L = in[1].shape[2];
  const float *Q = (const float *)in[0].data, *Kt = (const float *)in[1].data, *V = (const float *)in[2].data;
  float *O = (float *)out[0].data;
  const double scale = 1.0 / sqrt((double)D);
  for (int64_t bh = 0; bh < B * H; bh++) {
    const float *q0 = Q + bh * S * D, *k0 = Kt + bh * L * D, *v0 = V + bh * L * D;
    for (int64_t i = 0; i < S; i++) {
      const int64_t last = EDGETUNE_ATTENTION_CAUSAL ? i + (L - S) : L - 1; /* last visible key */
      const int64_t n = last + 1 < L ? (last + 1 > 0 ? last + 1 : 0) : L;
      float *o = O + (bh * S + i) * D;
      for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
      if (n == 0) continue;
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < n; j++) {
        double s = 0.0;
        for (int64_t d = 0; d < D; d++) s += (double)q0[i * D + d] * k0[j * D + d];
        if (s * scale > mx) mx = s * scale;
      }
      double acc[D > 0 ? D : 1];
      for (int64_t d = 0; d < D; d++) acc[d] = 0.0;
      for (int64_t j = 0; j < n; j++) {
        double s = 0.0;
        for (int64_t d = 0; d < D; d++) s += (double)q0[i * D + d] * k0[j * D + d];
        const double p = exp(s * scale - mx);
        sum += p;
        for (int64_t d = 0; d < D; d++) acc[d] += p * v0[j * D + d];
      }
      for (int64_t d = 0; d < D; d++) o[d] = (float)(acc[d] / sum);
    }
  }
  return 0;
}
