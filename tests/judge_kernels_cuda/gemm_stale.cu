// A dishonest CUDA GEMM (for the judge's own tests on a GPU): correct for its first calls, then it
// returns without launching anything, hoping its outputs are still there from before. The judge
// poisons the outputs in GPU memory before every call, so its timed outputs are NaN: wrong-when-timed.
#include <cuda_runtime.h>
#include <edgetune_kernel.h>

__global__ void gemm_naive(const float* A, const float* B, float* C, int M, int N, int K) {
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; k++) acc = fmaf(A[(size_t)row * K + k], B[(size_t)k * N + col], acc);
  C[(size_t)row * N + col] = acc;
}

static int calls;

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor* in, int32_t nin, DLTensor* out, int32_t nout) {
  if (nin != 2 || nout != 1) return 1;
  if (++calls > 6) return 0;  // "nothing changed": the shortcut the judge must catch
  int M = (int)in[0].shape[0], K = (int)in[0].shape[1], N = (int)in[1].shape[1];
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  gemm_naive<<<grid, block>>>((const float*)in[0].data, (const float*)in[1].data, (float*)out[0].data, M, N, K);
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}
