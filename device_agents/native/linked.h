/* Kernels linked into the agent at build time (static agents for phones, where dlopen is not
 * available). edgetune/build/native.py generates a table file; kernels_none.c is the empty one. */
#ifndef EDGETUNE_LINKED_H_
#define EDGETUNE_LINKED_H_

#include "tvm_abi.h"

typedef struct {
  const char* sha256; /* sha256 of the kernel artifact the host pushes (the object file) */
  const char* entry;  /* the symbol name it had in that object, e.g. "__tvm_ffi_main" */
  TVMFFISafeCallType fn;
} et_linked_kernel;

typedef struct {
  const char* name; /* e.g. "__TVMBackendParallelLaunch" */
  void** slot;      /* the kernel objects' function-pointer slot, NULL if no object defines it */
} et_linked_slot;

extern const et_linked_kernel et_linked_kernels[];
extern const int et_num_linked_kernels;
extern const et_linked_slot et_linked_slots[];
extern const int et_num_linked_slots;

#endif
