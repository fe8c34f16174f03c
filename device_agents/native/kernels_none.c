/* The default, empty table of linked kernels (see linked.h). */
#include <stddef.h>

#include "linked.h"

const et_linked_kernel et_linked_kernels[1] = {{NULL, NULL, NULL}};
const int et_num_linked_kernels = 0;
const et_linked_slot et_linked_slots[1] = {{NULL, NULL}};
const int et_num_linked_slots = 0;
