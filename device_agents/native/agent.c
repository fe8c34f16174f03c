/* edgetune-agent: the native device agent (C11, libc only). Speaks device_agents/PROTOCOL.md.
 *
 *   edgetune-agent info              one JSON object describing the device and runtimes
 *   edgetune-agent run JOBDIR        run JOBDIR/request.json, write outputs and JOBDIR/result.json
 *   edgetune-agent run-stdio JOBDIR  the request on stdin, the bundle on stdout; the job runs in a
 *                                    worker process under a supervisor that bounds it (PROTOCOL.md)
 *   edgetune-agent version           the agent version
 */
#include "agent_internal.h"

/* ------------------------------------------------------------------ small utilities */

int cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int param_int(const jval* params, const char* key, long long* out) {
  double d;
  if (json_num(json_get(params, key), &d) != 0) {
    const char* s = json_str(json_get(params, key)); /* tolerate "4" */
    char* end;
    if (!s || !*s) return -1;
    long long v = strtoll(s, &end, 10);
    if (*end) return -1;
    *out = v;
    return 0;
  }
  if (d != floor(d) || fabs(d) > 9e15) return -1;
  *out = (long long)d;
  return 0;
}

const char* param_str(const jval* params, const char* key) {
  return json_str(json_get(params, key));
}


static void agent_dir(const char* argv0, char* out, size_t outlen) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    buf[n] = 0;
  } else {
    snprintf(buf, sizeof buf, "%s", argv0);
  }
  char* slash = strrchr(buf, '/');
  if (slash) *slash = 0;
  else snprintf(buf, sizeof buf, ".");
  snprintf(out, outlen, "%s", buf[0] ? buf : "/");
}

/* ------------------------------------------------------------------ info */

static void write_fingerprint(sbuf* o) {
  et_fingerprint fp;
  et_fingerprint_collect(&fp);
  et_fingerprint_gpus(&fp);
  et_fingerprint_json(o, &fp);
  free(fp.gpus);
}

static int cmd_info(const char* dir) {
  struct utsname u;
  uname(&u);
  sbuf o;
  sb_init(&o);
  sb_printf(&o, "{\"protocol\":%d,\"agent\":\"native\",\"agent_version\":", PROTOCOL);
  sb_str(&o, ET_AGENT_VERSION);
  sb_raw(&o, ",\"arch\":");
  sb_str(&o, u.machine);
  sb_raw(&o, ",\"python\":null,\"runtimes\":{\"tvm-kernel\":\"1\",\"onnxruntime\":");
  char lib[PATH_MAX], ver[64];
  const char* ortv = NULL;
  if (ort_find_library(NULL, dir, lib, sizeof lib) == 0) ortv = ort_library_version(lib, ver, sizeof ver);
  sb_str(&o, ortv);
#ifdef ET_STATIC
  sb_raw(&o, ",\"judge\":null,\"judge-sandbox\":null"); /* no dlopen in a static agent */
#else
  char why[128];
  sb_printf(&o, ",\"judge\":\"1\",\"judge-sandbox\":\"%s\"", judge_seccomp_probe(why, sizeof why) ? "detect" : "seccomp");
#endif
  sb_raw(&o, ",\"tflite\":null,\"tvm\":null},\"fingerprint\":");
  write_fingerprint(&o);
  sb_printf(&o, ",\"nproc\":%d,\"clock\":\"CLOCK_MONOTONIC\"}", cpu_count());
  if (o.oom) return 1;
  puts(o.p);
  sb_free(&o);
  return 0;
}

int main(int argc, char** argv) {
  char dir[PATH_MAX];
  agent_dir(argv[0], dir, sizeof dir);
  if (argc >= 2 && !strcmp(argv[1], "info")) return cmd_info(dir);
  if (argc >= 3 && !strcmp(argv[1], "run")) return cmd_run(argv[2], dir);
  if (argc >= 3 && !strcmp(argv[1], "run-stdio")) return cmd_run_stdio(argv[2], dir);
  if (argc >= 2 && (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version"))) {
    puts(ET_AGENT_VERSION);
    return 0;
  }
  fprintf(stderr, "usage: %s info | run JOBDIR | run-stdio JOBDIR | version\n", argv[0]);
  return 2;
}
