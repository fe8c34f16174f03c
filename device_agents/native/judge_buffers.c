/* The judge's job state and its buffers: memfds shared with the kernel child, guards and poison. */
#include "judge_internal.h"

static judge_state* g_js; /* one job per process */

judge_state* jb_state_of(backend* b) {
  if (!b->state) {
    judge_state* s = (judge_state*)calloc(1, sizeof(judge_state));
    if (!s) return NULL;
    s->child = -1;
    b->state = s;
    g_js = s;
  }
  return (judge_state*)b->state;
}

/* ------------------------------------------------------------------ buffers */

static unsigned char guard_byte(size_t i) { return (unsigned char)(0x5Au ^ (i * 131u)); }

static void judge_release(et_tensor* t) {
  if (t->map) munmap(t->map, t->map_len);
  if (g_js)
    for (int i = 0; i < g_js->n_bufs; i++)
      if (g_js->bufs[i].map == t->map && g_js->bufs[i].fd >= 0) {
        close(g_js->bufs[i].fd);
        g_js->bufs[i].fd = -1;
        g_js->bufs[i].map = NULL;
      }
  t->map = NULL;
}

int judge_alloc(backend* b, et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape, int is_input,
                       char* err, size_t errlen) {
  judge_state* s = jb_state_of(b);
  memset(t, 0, sizeof *t);
  if (!s || s->n_bufs >= MAX_BUFS) {
    snprintf(err, errlen, "too many buffers");
    return -1;
  }
  if (ndim < 0 || ndim > ET_MAX_NDIM || !dtype_size(dtype)) {
    snprintf(err, errlen, "bad tensor");
    return -1;
  }
  size_t count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] && count > SIZE_MAX / 16 / (size_t)shape[i])) {
      snprintf(err, errlen, "bad shape");
      return -1;
    }
    count *= (size_t)shape[i];
    t->shape[i] = shape[i];
  }
  t->dtype = dtype;
  t->ndim = ndim;
  t->nbytes = count * dtype_size(dtype);
  size_t pg = jb_page_size();
  size_t guard = (16384 + pg - 1) / pg * pg; /* a read 8 KiB past the end still lands in it */
  size_t r64 = t->nbytes ? (t->nbytes + 63) / 64 * 64 : 64;
  size_t body = (r64 + pg - 1) / pg * pg;
  size_t len = guard + body + guard;
  int fd = (int)syscall(SYS_memfd_create, is_input ? "edgetune-judge-in" : "edgetune-judge-out",
                        MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    snprintf(err, errlen, "memfd_create: %s", strerror(errno));
    return -1;
  }
  if (ftruncate(fd, (off_t)len)) {
    snprintf(err, errlen, "cannot allocate %s: %s", is_input ? "input" : "output", strerror(errno));
    close(fd);
    return -1;
  }
  char* map = (char*)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    snprintf(err, errlen, "cannot allocate %s: %s", is_input ? "input" : "output", strerror(errno));
    close(fd);
    return -1;
  }
  size_t data_off = guard + body - r64;
  t->data = map + data_off;
  t->map = map;
  t->map_len = len;
  t->release = judge_release;
  if (is_input) {
    /* pad and slack: NaN (floats) or 0xA5, so a small read out of bounds pollutes the result */
    et_tensor pad = *t;
    pad.data = map + guard;
    pad.nbytes = body;
    pad.dtype = (dtype == DT_F32 || dtype == DT_F64 || dtype == DT_F16) ? dtype : DT_U8;
    pad.nbytes = body / dtype_size(pad.dtype) * dtype_size(pad.dtype);
    tensor_poison(&pad);
    memset(t->data, 0, t->nbytes);
    t->base = NULL;
    t->guard = 0; /* read-only in the child: nothing to check */
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  } else {
    /* the agent's guard check: ET_GUARD_BYTES before the data and (slack + ET_GUARD_BYTES) after */
    t->base = (char*)t->data - ET_GUARD_BYTES;
    t->guard = ET_GUARD_BYTES;
    unsigned char* lo = (unsigned char*)t->base;
    unsigned char* hi = (unsigned char*)t->data + t->nbytes;
    for (size_t i = 0; i < ET_GUARD_BYTES; i++) lo[i] = guard_byte(i);
    for (size_t i = 0; i < r64 - t->nbytes + ET_GUARD_BYTES; i++) hi[i] = guard_byte(i);
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  }
  jbuf* jb = &s->bufs[s->n_bufs++];
  jb->fd = fd;
  jb->map = map;
  jb->map_len = len;
  jb->guard = guard;
  jb->data_off = data_off;
  jb->nbytes = t->nbytes;
  jb->is_input = is_input;
  jb->index = -1;
  jb->t = t;
  return 0;
}
