/* Prints the layout of every TVM/DLPack struct the agent relies on. Built twice by
 * tests/unit/test_native_agent.py: against tvm_abi.h, and with -DET_REAL_HEADERS against TVM's
 * own headers (tvm_ffi/include, tvm/include); the two outputs must be identical. */
#include <stddef.h>
#include <stdio.h>

#ifdef ET_REAL_HEADERS
#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>
#include <tvm/runtime/c_backend_api.h>
#else
#include "tvm_abi.h"
#endif

#define F(T, m) printf(#T "." #m " %zu %zu\n", offsetof(T, m), sizeof(((T*)0)->m))
#define S(T) printf(#T " %zu\n", sizeof(T))

int main(void) {
  S(DLDevice); F(DLDevice, device_type); F(DLDevice, device_id);
  S(DLDataType); F(DLDataType, code); F(DLDataType, bits); F(DLDataType, lanes);
  S(DLTensor); F(DLTensor, data); F(DLTensor, device); F(DLTensor, ndim); F(DLTensor, dtype);
  F(DLTensor, shape); F(DLTensor, strides); F(DLTensor, byte_offset);
  S(TVMFFIAny); F(TVMFFIAny, type_index); F(TVMFFIAny, zero_padding); F(TVMFFIAny, v_int64);
  F(TVMFFIAny, v_ptr); F(TVMFFIAny, v_float64);
  S(TVMParallelGroupEnv); F(TVMParallelGroupEnv, sync_handle); F(TVMParallelGroupEnv, num_task);
  printf("kDLCPU %d kDLInt %d kDLUInt %d kDLFloat %d kDLBool %d\n", (int)kDLCPU, (int)kDLInt,
         (int)kDLUInt, (int)kDLFloat, (int)kDLBool);
  printf("kTVMFFINone %d kTVMFFIDLTensorPtr %d\n", (int)kTVMFFINone, (int)kTVMFFIDLTensorPtr);
  /* the hook signatures: assigning to the real typedefs fails to compile if they differ */
  FTVMParallelLambda lam = 0;
  int (*launch)(FTVMParallelLambda, void*, int) = TVMBackendParallelLaunch;
  int (*barrier)(int, TVMParallelGroupEnv*) = TVMBackendParallelBarrier;
  void* (*alloc)(int, int, uint64_t, int, int) = TVMBackendAllocWorkspace;
  int (*freews)(int, int, void*) = TVMBackendFreeWorkspace;
  void (*parts)(const char*, const char**, int32_t) = TVMFFIErrorSetRaisedFromCStrParts;
  void (*cstr)(const char*, const char*) = TVMFFIErrorSetRaisedFromCStr;
  TVMFFISafeCallType safe = 0;
  (void)lam; (void)launch; (void)barrier; (void)alloc; (void)freews; (void)parts; (void)cstr; (void)safe;
  return 0;
}
