#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  et_dtype t;
  const char* name;
  const char* descr; /* numpy descr as written by numpy on a little-endian machine */
  size_t size;
} kTypes[] = {
    {DT_F32, "float32", "<f4", 4}, {DT_F64, "float64", "<f8", 8}, {DT_F16, "float16", "<f2", 2},
    {DT_I8, "int8", "|i1", 1},     {DT_U8, "uint8", "|u1", 1},    {DT_I32, "int32", "<i4", 4},
    {DT_I64, "int64", "<i8", 8},   {DT_BOOL, "bool", "|b1", 1},
};
#define NTYPES (sizeof kTypes / sizeof kTypes[0])

et_dtype dtype_from_name(const char* name) {
  for (size_t i = 0; name && i < NTYPES; i++)
    if (!strcmp(name, kTypes[i].name)) return kTypes[i].t;
  return DT_INVALID;
}

const char* dtype_name(et_dtype t) {
  for (size_t i = 0; i < NTYPES; i++)
    if (kTypes[i].t == t) return kTypes[i].name;
  return "invalid";
}

size_t dtype_size(et_dtype t) {
  for (size_t i = 0; i < NTYPES; i++)
    if (kTypes[i].t == t) return kTypes[i].size;
  return 0;
}

static const char* dtype_descr(et_dtype t) {
  for (size_t i = 0; i < NTYPES; i++)
    if (kTypes[i].t == t) return kTypes[i].descr;
  return NULL;
}

static et_dtype dtype_from_descr(const char* d) {
  /* single-byte types may be written with '|' or '<' or '='; multi-byte must be little-endian */
  for (size_t i = 0; i < NTYPES; i++) {
    const char* want = kTypes[i].descr;
    if (!strcmp(d + 1, want + 1) &&
        (d[0] == want[0] || d[0] == '<' || (kTypes[i].size == 1 && (d[0] == '|' || d[0] == '='))))
      return kTypes[i].t;
  }
  return DT_INVALID;
}

int tensor_alloc(et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape) {
  memset(t, 0, sizeof *t);
  if (ndim < 0 || ndim > ET_MAX_NDIM || !dtype_size(dtype)) return -1;
  size_t count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] && count > SIZE_MAX / 16 / (size_t)shape[i]) return -1;
    count *= (size_t)shape[i];
    t->shape[i] = shape[i];
  }
  t->dtype = dtype;
  t->ndim = ndim;
  t->nbytes = count * dtype_size(dtype);
  size_t alloc = t->nbytes ? (t->nbytes + 63) / 64 * 64 : 64;
  if (posix_memalign(&t->data, 64, alloc)) {
    t->data = NULL;
    return -1;
  }
  memset(t->data, 0, alloc);
  return 0;
}

void tensor_free(et_tensor* t) {
  if (t->release) {
    t->release(t);
    t->release = NULL;
    t->map = NULL;
    t->data = NULL;
    t->base = NULL;
    return;
  }
  free(t->base ? t->base : t->data);
  t->data = NULL;
  t->base = NULL;
}

static unsigned char guard_byte(size_t i) { return (unsigned char)(0x5Au ^ (i * 131u)); }

int tensor_alloc_guarded(et_tensor* t, et_dtype dtype, int ndim, const int64_t* shape) {
  et_tensor probe;
  if (tensor_alloc(&probe, dtype, ndim, shape)) return -1;
  size_t body = (probe.nbytes + 63) / 64 * 64;
  void* base;
  if (posix_memalign(&base, 64, body + 2 * (size_t)ET_GUARD_BYTES)) {
    tensor_free(&probe);
    return -1;
  }
  *t = probe;
  free(probe.data);
  t->base = base;
  t->guard = ET_GUARD_BYTES;
  t->data = (char*)base + ET_GUARD_BYTES;
  memset(t->data, 0, body);
  unsigned char* lo = (unsigned char*)base;
  unsigned char* hi = (unsigned char*)t->data + t->nbytes;
  size_t hi_len = body - t->nbytes + ET_GUARD_BYTES;
  for (size_t i = 0; i < ET_GUARD_BYTES; i++) lo[i] = guard_byte(i);
  for (size_t i = 0; i < hi_len; i++) hi[i] = guard_byte(i);
  return 0;
}

int tensor_guard_check(const et_tensor* t) {
  if (!t->base || !t->guard) return 0;
  const unsigned char* lo = (const unsigned char*)t->base;
  for (size_t i = 0; i < t->guard; i++)
    if (lo[i] != guard_byte(i)) return -1;
  size_t body = (t->nbytes + 63) / 64 * 64;
  const unsigned char* hi = (const unsigned char*)t->data + t->nbytes;
  size_t hi_len = body - t->nbytes + t->guard;
  for (size_t i = 0; i < hi_len; i++)
    if (hi[i] != guard_byte(i)) return 1;
  return 0;
}

void tensor_poison(et_tensor* t) {
  size_t n = t->nbytes / (dtype_size(t->dtype) ? dtype_size(t->dtype) : 1);
  switch (t->dtype) {
    case DT_F32: {
      const uint32_t nan = 0x7FC00000u;
      for (size_t i = 0; i < n; i++) memcpy((char*)t->data + 4 * i, &nan, 4);
      break;
    }
    case DT_F64: {
      const uint64_t nan = 0x7FF8000000000000ull;
      for (size_t i = 0; i < n; i++) memcpy((char*)t->data + 8 * i, &nan, 8);
      break;
    }
    case DT_F16: {
      const uint16_t nan = 0x7E00u;
      for (size_t i = 0; i < n; i++) memcpy((char*)t->data + 2 * i, &nan, 2);
      break;
    }
    default:
      memset(t->data, 0xA5, t->nbytes);
  }
}

/* ---- reading ---- */

static const char* find_key(const char* h, const char* key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char* p = strstr(h, pat);
  if (!p) {
    snprintf(pat, sizeof pat, "\"%s\"", key);
    p = strstr(h, pat);
  }
  if (!p) return NULL;
  p += strlen(pat);
  while (*p == ' ') p++;
  if (*p != ':') return NULL;
  p++;
  while (*p == ' ') p++;
  return p;
}

static int parse_header(const char* h, et_dtype* dt, int* ndim, int64_t* shape, char* err,
                        size_t errlen) {
  const char* p = find_key(h, "descr");
  if (!p || (*p != '\'' && *p != '"')) {
    snprintf(err, errlen, "npy header has no descr");
    return -1;
  }
  char q = *p++;
  char descr[16];
  size_t i = 0;
  while (*p && *p != q && i < sizeof descr - 1) descr[i++] = *p++;
  descr[i] = 0;
  *dt = dtype_from_descr(descr);
  if (*dt == DT_INVALID) {
    snprintf(err, errlen, "unsupported npy dtype '%s' (little-endian %s only)", descr,
             "float32/float64/float16/int8/uint8/int32/int64/bool");
    return -1;
  }
  p = find_key(h, "fortran_order");
  if (!p || strncmp(p, "False", 5)) {
    snprintf(err, errlen, "npy file is not C order");
    return -1;
  }
  p = find_key(h, "shape");
  if (!p || *p != '(') {
    snprintf(err, errlen, "npy header has no shape");
    return -1;
  }
  p++;
  *ndim = 0;
  for (;;) {
    while (*p == ' ' || *p == ',') p++;
    if (*p == ')') break;
    char* end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || v < 0 || *ndim >= ET_MAX_NDIM) {
      snprintf(err, errlen, "bad npy shape");
      return -1;
    }
    shape[(*ndim)++] = v;
    p = end;
    while (*p == 'L') p++; /* python2-era long suffix */
  }
  return 0;
}

int npy_read(const char* path, et_tensor* t, char* err, size_t errlen) {
  memset(t, 0, sizeof *t);
  FILE* f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  unsigned char pre[12];
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6)) {
    snprintf(err, errlen, "%s is not an .npy file", path);
    fclose(f);
    return -1;
  }
  size_t hlen;
  int major = pre[6];
  if (major == 1) {
    hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
  } else if (major == 2 || major == 3) {
    if (fread(pre + 10, 1, 2, f) != 2) {
      snprintf(err, errlen, "%s: truncated header", path);
      fclose(f);
      return -1;
    }
    hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
  } else {
    snprintf(err, errlen, "%s: unsupported npy version %d", path, major);
    fclose(f);
    return -1;
  }
  if (hlen > (1u << 20)) {
    snprintf(err, errlen, "%s: header too large", path);
    fclose(f);
    return -1;
  }
  char* h = (char*)malloc(hlen + 1);
  if (!h || fread(h, 1, hlen, f) != hlen) {
    snprintf(err, errlen, "%s: truncated header", path);
    free(h);
    fclose(f);
    return -1;
  }
  h[hlen] = 0;
  et_dtype dt;
  int ndim;
  int64_t shape[ET_MAX_NDIM];
  char perr[160];
  int rc = parse_header(h, &dt, &ndim, shape, perr, sizeof perr);
  free(h);
  if (rc) {
    snprintf(err, errlen, "%s: %s", path, perr);
    fclose(f);
    return -1;
  }
  if (tensor_alloc(t, dt, ndim, shape)) {
    snprintf(err, errlen, "%s: cannot allocate tensor", path);
    fclose(f);
    return -1;
  }
  if (fread(t->data, 1, t->nbytes, f) != t->nbytes) {
    snprintf(err, errlen, "%s: truncated data (%zu bytes expected)", path, t->nbytes);
    tensor_free(t);
    fclose(f);
    return -1;
  }
  fclose(f);
  return 0;
}

/* ---- writing ---- */

int npy_write(const char* path, const et_tensor* t, char* err, size_t errlen) {
  char dict[512];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                   dtype_descr(t->dtype));
  for (int i = 0; i < t->ndim; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s", (long long)t->shape[i],
                  (i + 1 < t->ndim) ? " " : "");
  if (t->ndim > 1) n--; /* numpy writes (2, 3) but (5,) */
  n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  /* pad with spaces + '\n' so that magic(6)+version(2)+len(2)+header is a multiple of 64 */
  size_t total = 10 + (size_t)n + 1;
  size_t padded = (total + 63) / 64 * 64;
  size_t hlen = padded - 10;
  if (hlen > 65535) {
    snprintf(err, errlen, "npy header too long");
    return -1;
  }
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xFF),
                           (unsigned char)(hlen >> 8)};
  FILE* f = fopen(path, "wb");
  if (!f) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
  for (size_t i = (size_t)n; ok && i < hlen - 1; i++) ok = fputc(' ', f) != EOF;
  ok = ok && fputc('\n', f) != EOF;
  ok = ok && fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
  ok = (fclose(f) == 0) && ok;
  if (!ok) {
    snprintf(err, errlen, "write failed for %s", path);
    return -1;
  }
  return 0;
}
