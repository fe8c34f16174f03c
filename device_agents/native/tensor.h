/* Host-side tensors of the agent and their .npy files (format 1.0, little-endian, C order). */
#ifndef EDGETUNE_TENSOR_H_
#define EDGETUNE_TENSOR_H_

#include <stddef.h>
#include <stdint.h>

#define ET_MAX_NDIM 16

typedef enum { DT_INVALID = 0, DT_F32, DT_F64, DT_F16, DT_I8, DT_U8, DT_I32, DT_I64, DT_BOOL } et_dtype;

typedef struct {
  et_dtype dtype;
  int ndim;
  int64_t shape[ET_MAX_NDIM];
  void* data; /* 64-byte aligned (TVM kernels assume it), owned */
  size_t nbytes;
} et_tensor;

et_dtype dtype_from_name(const char* name); /* "float32" ... ; DT_INVALID if unknown */
const char* dtype_name(et_dtype t);
size_t dtype_size(et_dtype t);

/* Allocate zeroed aligned storage for dtype/shape. 0 on success. */
int tensor_alloc(et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape);
void tensor_free(et_tensor* t);
/* Fill with NaN (float dtypes) or the byte 0xA5 (integer/bool dtypes: never a valid bool, and an
 * unlikely integer pattern), so a kernel that skips part of its output is caught by the host. */
void tensor_poison(et_tensor* t);

int npy_read(const char* path, et_tensor* t, char* err, size_t errlen);
int npy_write(const char* path, const et_tensor* t, char* err, size_t errlen);

#endif
