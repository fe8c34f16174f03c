/*
 * edgetune_kernel.h — the ABI of a kernel that `edgetune judge` verifies and times.
 *
 * A kernel is a shared object (or a C/C++ source edgetune compiles into one) that exports
 *
 *     EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *inputs, int32_t num_inputs,
 *                                         DLTensor *outputs, int32_t num_outputs);
 *
 * `inputs` and `outputs` are ARRAYS of DLTensor, in the order and shapes of the op spec
 * (gemm:M,N,K: A[M,K], B[K,N] -> C[M,N]; softmax:M,N: X -> Y over the last axis;
 * layernorm:M,N: X[M,N], gamma[N], beta[N] -> Y (eps 1e-5, population variance);
 * attention:B,H,S,D[,L][,causal]: Q[B,H,S,D], K[B,H,L,D], V[B,H,L,D] -> O[B,H,S,D]).
 * Tensors are row-major float32 on the CPU (kDLCPU), `strides` is NULL and `byte_offset` 0; a
 * gemm or batch_matmul spec with dtype=float16 passes float16 operands (kDLFloat, 16 bits) and
 * takes a float32 output (float32 accumulation, as tensor cores compute).
 * Return 0 on success, anything else is a failure the judge records.
 *
 * A CUDA kernel (a .cu file, built with nvcc for the device GPU's SM) exports the same function;
 * its tensors are kDLCUDA on device 0 and `data` points to GPU memory (guard zones around every
 * buffer). It launches its work on any stream and returns: the judge's call ends with
 * cuCtxSynchronize, which the time includes, and the outputs are read after it.
 *
 * The kernel runs in a sandboxed child process: inputs are mapped read-only with guard pages
 * around every buffer; exec, fork, sockets and file writes are refused; defining a libc symbol
 * (clock_gettime, memcpy, malloc, ...) gets the kernel refused before it runs. Outputs are
 * checked on inputs the kernel has not seen, including outputs of timed calls.
 */
#ifndef EDGETUNE_KERNEL_H_
#define EDGETUNE_KERNEL_H_

#include <stdint.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
#define EDGETUNE_EXTERN_C extern "C"
#else
#define EDGETUNE_EXTERN_C
#endif

/* Put before the definition of edgetune_kernel: C linkage, exported from the shared object. */
#define EDGETUNE_KERNEL EDGETUNE_EXTERN_C __attribute__((visibility("default")))

/* The entry point the judge calls; see the comment at the top of this file. */
EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *inputs, int32_t num_inputs,
                                    DLTensor *outputs, int32_t num_outputs);

#endif /* EDGETUNE_KERNEL_H_ */
