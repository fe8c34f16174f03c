/* Host-side tensors of the agent and their .npy files (format 1.0, little-endian, C order). */
#ifndef EDGETUNE_TENSOR_H_
#define EDGETUNE_TENSOR_H_

#include <stddef.h>
#include <stdint.h>

#define ET_MAX_NDIM 16

typedef enum { DT_INVALID = 0, DT_F32, DT_F64, DT_F16, DT_I8, DT_U8, DT_I32, DT_I64, DT_BOOL } et_dtype;

typedef struct et_tensor {
  et_dtype dtype;
  int ndim;
  int64_t shape[ET_MAX_NDIM];
  void* data; /* 64-byte aligned (TVM kernels assume it), owned */
  size_t nbytes;
  void* base;   /* what was allocated: data minus the guard zone (NULL: data itself) */
  size_t guard; /* bytes of guard pattern before data and after data + nbytes */
  /* a backend's own storage (a mapping): freed by release(t), not free() */
  void* map;
  size_t map_len;
  void (*release)(struct et_tensor* t);
} et_tensor;

/* Guard zones: a candidate that writes before or past a buffer it was given overwrites them. */
#define ET_GUARD_BYTES 4096

et_dtype dtype_from_name(const char* name); /* "float32" ... ; DT_INVALID if unknown */
const char* dtype_name(et_dtype t);
size_t dtype_size(et_dtype t);

/* Allocate zeroed aligned storage for dtype/shape. 0 on success. */
int tensor_alloc(et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape);
void tensor_free(et_tensor* t);
/* Like tensor_alloc, with ET_GUARD_BYTES of a known pattern on both sides of the data. */
int tensor_alloc_guarded(et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape);
/* 0 when both guard zones are intact; -1 below the data, 1 past its end. */
int tensor_guard_check(const et_tensor* t);
/* Fill with NaN (float dtypes) or the byte 0xA5 (integer/bool dtypes: never a valid bool, and an
 * unlikely integer pattern), so a kernel that skips part of its output is caught by the host. */
void tensor_poison(et_tensor* t);

int npy_read(const char* path, et_tensor* t, char* err, size_t errlen);
int npy_write(const char* path, const et_tensor* t, char* err, size_t errlen);

#endif
