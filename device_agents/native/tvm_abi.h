/* The slice of the TVM FFI / DLPack / TVM backend ABI that an exported kernel uses.
 *
 * Copied field by field from tvm_ffi/include/tvm/ffi/c_api.h (TVM FFI 0.1.x),
 * tvm_ffi/include/dlpack/dlpack.h and tvm/include/tvm/runtime/c_backend_api.h so the agent
 * builds without TVM installed. tests/unit/test_native_agent.py compiles abi_check.c against
 * the real headers and compares every size and offset with this file. */
#ifndef EDGETUNE_TVM_ABI_H_
#define EDGETUNE_TVM_ABI_H_

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int32_t device_type; /* DLDeviceType enum: kDLCPU = 1 */
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code; /* kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6 */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

enum { kDLCPU = 1, kDLCUDA = 2 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

/* TVMFFITypeIndex values used here. */
enum { kTVMFFINone = 0, kTVMFFIInt = 1, kTVMFFIDLTensorPtr = 7 };

typedef struct {
  int32_t type_index;
  union {
    uint32_t zero_padding;
    uint32_t small_str_len;
  };
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
    const char* v_c_str;
    void* v_obj;
    DLDataType v_dtype;
    DLDevice v_device;
    char v_bytes[8];
    uint64_t v_uint64;
  };
} TVMFFIAny;

typedef int (*TVMFFISafeCallType)(void* handle, const TVMFFIAny* args, int32_t num_args,
                                  TVMFFIAny* result);

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;

typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

_Static_assert(sizeof(DLDevice) == 8, "DLDevice layout");
_Static_assert(sizeof(DLDataType) == 4, "DLDataType layout");
_Static_assert(sizeof(TVMFFIAny) == 16, "TVMFFIAny layout");
_Static_assert(offsetof(TVMFFIAny, v_int64) == 8, "TVMFFIAny layout");

/* The hooks the agent supplies (exported with -rdynamic; also written into the kernel's
 * __TVMBackend* / __TVMFFI* function-pointer slots after dlopen). */
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task);
int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv);
void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                               int dtype_code_hint, int dtype_bits_hint);
int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr);
void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message);
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** message_parts,
                                       int32_t num_parts);
int TVMFFIHandleInitOnce(void** handle_addr, int (*init_func)(void** result));
int TVMFFIFunctionCall(void* func, TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);
int TVMFFIEnvModLookupFromImports(void* library_ctx, const char* func_name, void** out);

/* The function-pointer slots an exported kernel may define, each named "__" + its hook; whoever
 * loads a kernel (tvm_backend.c, judge_backend.c, ortop.c) writes its hooks into them:
 *   static const et_tvm_slot kSlots[] = {ET_TVM_SLOTS}; */
typedef struct {
  const char* name;
  void* fn;
} et_tvm_slot;
#define ET_TVM_SLOT(f) {"__" #f, (void*)&f}
#define ET_TVM_SLOTS                                                                              \
  ET_TVM_SLOT(TVMBackendParallelLaunch), ET_TVM_SLOT(TVMBackendParallelBarrier),                  \
      ET_TVM_SLOT(TVMBackendAllocWorkspace), ET_TVM_SLOT(TVMBackendFreeWorkspace),                \
      ET_TVM_SLOT(TVMFFIErrorSetRaisedFromCStr), ET_TVM_SLOT(TVMFFIHandleInitOnce),               \
      ET_TVM_SLOT(TVMFFIFunctionCall), ET_TVM_SLOT(TVMFFIEnvModLookupFromImports)

#endif
