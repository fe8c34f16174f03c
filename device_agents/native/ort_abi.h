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
};

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

#define ORT_FN(api, idx, type) ((type)(((void* const*)(const void*)(api))[idx]))

#endif
