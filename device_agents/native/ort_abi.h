/* The slice of onnxruntime's C API (onnxruntime_c_api.h) the agent uses, as slot indices.
 *
 * OrtApi is a struct of function pointers that only ever grows at the end, so an entry's index
 * is fixed across releases. Indices counted from the declaration order of `struct OrtApi` in
 * microsoft/onnxruntime include/onnxruntime/core/session/onnxruntime_c_api.h (API 13); every
 * entry used here exists since API version 1. */
#ifndef EDGETUNE_ORT_ABI_H_
#define EDGETUNE_ORT_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtSession OrtSession;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtValue OrtValue;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtApi OrtApi;

typedef struct {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

typedef const OrtApiBase* (*OrtGetApiBaseFn)(void);

enum {
  ORT_GetErrorMessage = 2,
  ORT_CreateEnv = 3,
  ORT_CreateSession = 7,
  ORT_Run = 9,
  ORT_CreateSessionOptions = 10,
  ORT_SetSessionExecutionMode = 13,
  ORT_SetSessionLogSeverityLevel = 22,
  ORT_SetSessionGraphOptimizationLevel = 23,
  ORT_SetIntraOpNumThreads = 24,
  ORT_SetInterOpNumThreads = 25,
  ORT_SessionGetInputCount = 30,
  ORT_SessionGetOutputCount = 31,
  ORT_CreateTensorWithDataAsOrtValue = 49,
  ORT_GetTensorMutableData = 51,
  ORT_CreateCpuMemoryInfo = 69,
  ORT_ReleaseEnv = 92,
  ORT_ReleaseStatus = 93,
  ORT_ReleaseMemoryInfo = 94,
  ORT_ReleaseSession = 95,
  ORT_ReleaseValue = 96,
  ORT_ReleaseSessionOptions = 100,
  /* the custom-op library (ortop.c) and RegisterCustomOpsLibrary_V2 (ort_backend.c) */
  ORT_CreateStatus = 0,
  ORT_CreateCustomOpDomain = 26,
  ORT_CustomOpDomain_Add = 27,
  ORT_AddCustomOpDomain = 28,
  ORT_GetTensorElementType = 60,
  ORT_GetDimensionsCount = 61,
  ORT_GetDimensions = 62,
  ORT_GetTensorTypeAndShape = 65,
  ORT_KernelInfoGetAttribute_string = 87,
  ORT_KernelContext_GetInputCount = 88,
  ORT_KernelContext_GetInput = 90,
  ORT_KernelContext_GetOutput = 91,
  ORT_ReleaseTensorTypeAndShapeInfo = 99,
  ORT_RegisterCustomOpsLibrary_V2 = 228, /* API 14 */
  ORT_KernelContext_ParallelFor = 274,   /* API 17 */
};

/* the C API version the custom-op library asks for (KernelContext_ParallelFor: onnxruntime 1.17) */
#define ET_ORT_API_VERSION 17

/* enum values from the same header */
enum { ORT_LOGGING_LEVEL_ERROR = 3 };
enum { ORT_SEQUENTIAL = 0, ORT_PARALLEL = 1 };
enum { OrtDeviceAllocator = 0, OrtArenaAllocator = 1 };
enum { OrtMemTypeDefault = 0 };
enum {
  ONNX_FLOAT = 1, ONNX_UINT8 = 2, ONNX_INT8 = 3, ONNX_INT32 = 6, ONNX_INT64 = 7,
  ONNX_BOOL = 9, ONNX_FLOAT16 = 10, ONNX_DOUBLE = 11
};

typedef const char* (*OrtGetErrorMessageFn)(const OrtStatus*);
typedef OrtStatus* (*OrtCreateEnvFn)(int level, const char* logid, OrtEnv** out);
typedef OrtStatus* (*OrtCreateSessionFn)(const OrtEnv*, const char* path, const OrtSessionOptions*,
                                         OrtSession** out);
typedef OrtStatus* (*OrtRunFn)(OrtSession*, const OrtRunOptions*, const char* const* input_names,
                               const OrtValue* const* inputs, size_t n_in,
                               const char* const* output_names, size_t n_out, OrtValue** outputs);
typedef OrtStatus* (*OrtCreateSessionOptionsFn)(OrtSessionOptions** out);
typedef OrtStatus* (*OrtSetIntFn)(OrtSessionOptions*, int);
typedef OrtStatus* (*OrtSessionCountFn)(const OrtSession*, size_t*);
typedef OrtStatus* (*OrtCreateTensorWithDataFn)(const OrtMemoryInfo*, void* data, size_t nbytes,
                                                const int64_t* shape, size_t ndim, int type,
                                                OrtValue** out);
typedef OrtStatus* (*OrtGetTensorMutableDataFn)(OrtValue*, void** out);
typedef OrtStatus* (*OrtCreateCpuMemoryInfoFn)(int allocator_type, int mem_type, OrtMemoryInfo** out);
typedef void (*OrtReleaseFn)(void*);
typedef OrtStatus* (*OrtRegisterCustomOpsLibraryV2Fn)(OrtSessionOptions*, const char* library_name);

/* ---- custom operators (ortop.c) ---- */
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
enum { ORT_OK = 0, ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2, ORT_RUNTIME_EXCEPTION = 6 };
enum { INPUT_OUTPUT_REQUIRED = 0, INPUT_OUTPUT_OPTIONAL = 1 };

/* struct OrtCustomOp up to KernelComputeV2, the fields onnxruntime reads for version 16
 * (CreateKernelV2/KernelComputeV2 need >= 16; later fields are read only from 17 on) */
#define ET_CUSTOM_OP_VERSION 16
typedef struct OrtCustomOp OrtCustomOp;
struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
  const char* (*GetName)(const OrtCustomOp* op);
  const char* (*GetExecutionProviderType)(const OrtCustomOp* op);
  int (*GetInputType)(const OrtCustomOp* op, size_t index); /* ONNXTensorElementDataType */
  size_t (*GetInputTypeCount)(const OrtCustomOp* op);
  int (*GetOutputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const OrtCustomOp* op);
  void (*KernelCompute)(void* op_kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* op_kernel);
  int (*GetInputCharacteristic)(const OrtCustomOp* op, size_t index);
  int (*GetOutputCharacteristic)(const OrtCustomOp* op, size_t index);
  int (*GetInputMemoryType)(const OrtCustomOp* op, size_t index); /* OrtMemType */
  int (*GetVariadicInputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp* op);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp* op);
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, void** kernel);
  OrtStatus* (*KernelComputeV2)(void* op_kernel, OrtKernelContext* context);
};

typedef OrtStatus* (*OrtCreateStatusFn)(int code, const char* msg);
typedef OrtStatus* (*OrtCreateCustomOpDomainFn)(const char* domain, OrtCustomOpDomain** out);
typedef OrtStatus* (*OrtCustomOpDomainAddFn)(OrtCustomOpDomain*, const OrtCustomOp*);
typedef OrtStatus* (*OrtAddCustomOpDomainFn)(OrtSessionOptions*, OrtCustomOpDomain*);
typedef OrtStatus* (*OrtGetTensorElementTypeFn)(const OrtTensorTypeAndShapeInfo*, int* out);
typedef OrtStatus* (*OrtGetDimensionsCountFn)(const OrtTensorTypeAndShapeInfo*, size_t* out);
typedef OrtStatus* (*OrtGetDimensionsFn)(const OrtTensorTypeAndShapeInfo*, int64_t* dims, size_t n);
typedef OrtStatus* (*OrtGetTensorTypeAndShapeFn)(const OrtValue*, OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*OrtKernelInfoGetAttributeStringFn)(const OrtKernelInfo*, const char* name, char* out,
                                                        size_t* size);
typedef OrtStatus* (*OrtKernelContextCountFn)(const OrtKernelContext*, size_t* out);
typedef OrtStatus* (*OrtKernelContextGetInputFn)(const OrtKernelContext*, size_t index, const OrtValue** out);
typedef OrtStatus* (*OrtKernelContextGetOutputFn)(OrtKernelContext*, size_t index, const int64_t* dims,
                                                  size_t n, OrtValue** out);
typedef OrtStatus* (*OrtParallelForFn)(const OrtKernelContext*, void (*fn)(void*, size_t), size_t total,
                                       size_t num_batch, void* usr_data);

/* an et_tensor dtype (tensor.h) as ONNX's element type */
static inline int et_onnx_type(et_dtype t) {
  switch (t) {
    case DT_F32: return ONNX_FLOAT;
    case DT_F64: return ONNX_DOUBLE;
    case DT_F16: return ONNX_FLOAT16;
    case DT_I8: return ONNX_INT8;
    case DT_U8: return ONNX_UINT8;
    case DT_I32: return ONNX_INT32;
    case DT_I64: return ONNX_INT64;
    case DT_BOOL: return ONNX_BOOL;
    default: return 0;
  }
}

#define ORT_FN(api, idx, type) ((type)(((void* const*)(const void*)(api))[idx]))

#endif
