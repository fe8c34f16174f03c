/* The device fingerprint (docs/design.md §3): what the native agent reports in `info`, and what
 * the app loader (edgetune_loader.c) reads on the running device to pick its configuration.
 * One implementation, so the two can never disagree about a device. */
#ifndef EDGETUNE_FINGERPRINT_H_
#define EDGETUNE_FINGERPRINT_H_

#include <stddef.h>

#include "json.h"

#define ET_FP_MAX_CPUS 256

typedef struct {
  char arch[64];       /* uname -m */
  char cpu_model[256]; /* as the native agent names it */
  char cpu_model_py[256]; /* as the Python agent names it (they differ on some ARM kernels) */
  char soc[256];       /* /proc/cpuinfo Hardware, else Android's ro.soc.model / ro.board.platform */
  char soc_py[256];    /* /proc/cpuinfo Hardware only (the Python agent) */
  int cores;          /* configured CPUs (the native agent's count) */
  int cores_online;   /* online CPUs (the Python agent's os.cpu_count()) */
  long long max_freq_khz[ET_FP_MAX_CPUS];
  int n_freq;
  char kernel[256];
  char os[512];
  char governor[128];  /* "" when unreadable */
  char emulated[128];  /* $EDGETUNE_EMULATED, "" when unset */
  char* gpus;          /* JSON array of the NVIDIA GPUs (et_fingerprint_gpus), NULL: none or not looked */
} et_fingerprint;

void et_fingerprint_collect(et_fingerprint* fp);
/* The device's NVIDIA GPUs, as the Python agent reports them (nvidia-smi's name, compute capability
 * as "sm_90", driver, memory in MiB, max SM and memory clocks, PCI bus; the CUDA version of libcuda's
 * cuDriverGetVersion and of the CUDA runtime ldconfig knows first): into fp->gpus, none -> NULL.
 * Runs nvidia-smi (posix_spawn) when it is on PATH; never initialises CUDA in this process. The
 * agent's `info` calls it; the app loader does not. */
void et_fingerprint_gpus(et_fingerprint* fp);
/* the `fingerprint` object of the agent's info (without arch, which info reports beside it) */
void et_fingerprint_json(sbuf* o, const et_fingerprint* fp);

/* small file helpers shared with the agent */
char* et_read_text(const char* path, size_t max); /* NUL-terminated, malloc'd; NULL if unreadable */
void et_trim(char* s);
long long et_read_ll(const char* path); /* the integer a file starts with; -1 if none */
/* One "key : value" line of /proc/cpuinfo (first match), or "key=value" of a .prop file. */
int et_field(const char* text, const char* key, char sep, char* out, size_t outlen);

#endif
