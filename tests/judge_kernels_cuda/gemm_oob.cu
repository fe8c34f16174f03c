// A CUDA GEMM that also writes one float past the end of its output (for the judge's own tests on a
// GPU): the device guard zone after C is overwritten, which the judge names out-of-bounds-write.
#include <cuda_runtime.h>
#include <edgetune_kernel.h>

__global__ void gemm_naive(const float* A, const float* B, float* C, int M, int N, int K) {
  int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; k++) acc = fmaf(A[(size_t)row * K + k], B[(size_t)k * N + col], acc);
  C[(size_t)row * N + col] = acc;
  if (row == M - 1 && col == N - 1) C[(size_t)M * N + 3] = 1.0f;  // out of bounds
}

EDGETUNE_KERNEL int edgetune_kernel(const DLTensor* in, int32_t nin, DLTensor* out, int32_t nout) {
  if (nin != 2 || nout != 1) return 1;
  int M = (int)in[0].shape[0], K = (int)in[0].shape[1], N = (int)in[1].shape[1];
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  gemm_naive<<<grid, block>>>((const float*)in[0].data, (const float*)in[1].data, (float*)out[0].data, M, N, K);
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}
