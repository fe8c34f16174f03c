/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=correct -- honest C++17 blocked gemm (templated 4x8 tile, std::vector packing) */
/* Built with -static-libstdc++ -static-libgcc so a phone without libstdc++ can load it. */
#include <edgetune_kernel.h>

#include <algorithm>
#include <vector>

namespace {
constexpr int64_t MR = 4, NR = 8, KC = 256;

template <int64_t R, int64_t Cn>
void tile(int64_t kc, const float *a, const float *b, float *C, int64_t ldc, int64_t mr, int64_t nr, bool first) {
  float acc[R][Cn] = {};
  for (int64_t k = 0; k < kc; k++)
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < Cn; c++) acc[r][c] += a[k * R + r] * b[k * Cn + c];
  for (int64_t r = 0; r < mr; r++)
    for (int64_t c = 0; c < nr; c++) C[r * ldc + c] = first ? acc[r][c] : C[r * ldc + c] + acc[r][c];
}
}  // namespace

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = static_cast<const float *>(in[0].data), *B = static_cast<const float *>(in[1].data);
  float *C = static_cast<float *>(out[0].data);
  if (K == 0) {
    std::fill(C, C + M * N, 0.0f);
    return 0;
  }
  const int64_t Mp = (M + MR - 1) / MR * MR, Np = (N + NR - 1) / NR * NR;
  std::vector<float> ap(Mp * KC), bp(Np * KC);
  for (int64_t pc = 0; pc < K; pc += KC) {
    const int64_t kc = std::min(KC, K - pc);
    for (int64_t jp = 0; jp < Np; jp += NR)
      for (int64_t k = 0; k < kc; k++)
        for (int64_t c = 0; c < NR; c++) bp[jp * kc + k * NR + c] = jp + c < N ? B[(pc + k) * N + jp + c] : 0.0f;
    for (int64_t ip = 0; ip < Mp; ip += MR)
      for (int64_t k = 0; k < kc; k++)
        for (int64_t r = 0; r < MR; r++) ap[ip * kc + k * MR + r] = ip + r < M ? A[(ip + r) * K + pc + k] : 0.0f;
    for (int64_t ip = 0; ip < Mp; ip += MR)
      for (int64_t jp = 0; jp < Np; jp += NR)
        tile<MR, NR>(kc, &ap[ip * kc], &bp[jp * kc], C + ip * N + jp, N, std::min(MR, M - ip), std::min(NR, N - jp),
                     pc == 0);
  }
  return 0;
}
