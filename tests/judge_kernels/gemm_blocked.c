/* edgetune-judge: op=gemm:M=97,N=130,K=75 expect=correct -- honest cache-blocked gemm: packed panels, 4x8 register tile, any M,N,K */
/* B is packed in KC x NC blocks of 8-column panels, A in MC x KC blocks of 4-row panels, both
 * zero-padded, so the 4x8 micro-kernel needs no edge cases; only valid rows/columns are stored.
 * The inner loops are plain C that the compiler auto-vectorises. No allocation: static buffers. */
#include <edgetune_kernel.h>

enum { MR = 4, NR = 8, MC = 64, KC = 256, NC = 512 };
static float Ap[MC * KC] __attribute__((aligned(64)));
static float Bp[KC * NC] __attribute__((aligned(64)));

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void micro(int64_t kc, const float *restrict a, const float *restrict b, float *restrict C, int64_t ldc,
                  int64_t mr, int64_t nr, int first) {
  float acc[MR][NR] = {{0}};
  for (int64_t k = 0; k < kc; k++)
    for (int r = 0; r < MR; r++)
      for (int c = 0; c < NR; c++) acc[r][c] += a[k * MR + r] * b[k * NR + c];
  for (int64_t r = 0; r < mr; r++)
    for (int64_t c = 0; c < nr; c++) C[r * ldc + c] = first ? acc[r][c] : C[r * ldc + c] + acc[r][c];
}

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *in, int32_t n_in, DLTensor *out, int32_t n_out) {
  if (n_in != 2 || n_out != 1) return 1;
  const int64_t M = in[0].shape[0], K = in[0].shape[1], N = in[1].shape[1];
  const float *A = (const float *)in[0].data, *B = (const float *)in[1].data;
  float *C = (float *)out[0].data;
  if (K == 0) {
    for (int64_t i = 0; i < M * N; i++) C[i] = 0.0f;
    return 0;
  }
  for (int64_t jc = 0; jc < N; jc += NC) {
    const int64_t nc = min64(NC, N - jc);
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = min64(KC, K - pc);
      for (int64_t jp = 0; jp < nc; jp += NR) /* pack B[pc:pc+kc, jc+jp:+NR] */
        for (int64_t k = 0; k < kc; k++)
          for (int64_t c = 0; c < NR; c++)
            Bp[jp * kc + k * NR + c] = jp + c < nc ? B[(pc + k) * N + jc + jp + c] : 0.0f;
      for (int64_t ic = 0; ic < M; ic += MC) {
        const int64_t mc = min64(MC, M - ic);
        for (int64_t ip = 0; ip < mc; ip += MR) /* pack A[ic+ip:+MR, pc:pc+kc] */
          for (int64_t k = 0; k < kc; k++)
            for (int64_t r = 0; r < MR; r++)
              Ap[ip * kc + k * MR + r] = ip + r < mc ? A[(ic + ip + r) * K + pc + k] : 0.0f;
        for (int64_t ip = 0; ip < mc; ip += MR)
          for (int64_t jp = 0; jp < nc; jp += NR)
            micro(kc, Ap + ip * kc, Bp + jp * kc, C + (ic + ip) * N + jc + jp, N, min64(MR, mc - ip),
                  min64(NR, nc - jp), pc == 0);
      }
    }
  }
  return 0;
}
