/* SHA-256 (FIPS 180-4), streaming. */
#ifndef EDGETUNE_SHA256_H_
#define EDGETUNE_SHA256_H_

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t h[8];
  uint64_t nbytes;
  uint8_t block[64];
  size_t fill;
} sha256_ctx;

void sha256_init(sha256_ctx* c);
void sha256_update(sha256_ctx* c, const void* data, size_t n);
void sha256_final(sha256_ctx* c, uint8_t out[32]);
/* Lower-case hex digest of a buffer / a file into hex[65]. File: 0 on success, -1 on I/O error. */
void sha256_hex(const void* data, size_t n, char hex[65]);
int sha256_file_hex(const char* path, char hex[65]);

#endif
