/* edgetune's app loader: the C library an app (or a board's service) links to run an exported
 * edgetune artifact (docs/export.md). It reads the artifact's config.json, matches the running
 * device's fingerprint against the devices the artifact was tuned on, checks the sha256 of every
 * file it loads, and creates the onnxruntime session with exactly the configuration edgetune
 * selected and verified for that device (threads, optimization level, execution mode, spinning,
 * execution provider and its options, custom-op library). Devices the artifact does not know get
 * its fallback configuration.
 *
 * onnxruntime is loaded with dlopen (libonnxruntime.so: the one the app packages, e.g. from the
 * onnxruntime-android AAR), so the library itself needs only libc. Thread-safety: one et_session
 * per thread, or serialize the calls. */
#ifndef EDGETUNE_LOADER_H_
#define EDGETUNE_LOADER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ET_LOADER_ABI 1

typedef struct et_session et_session;

/* how well the running device matched the artifact's devices */
enum {
  ET_MATCH_FALLBACK = 0, /* an unknown device: the artifact's fallback configuration */
  ET_MATCH_HARDWARE = 1, /* same CPU, cores and frequencies, another kernel or OS build */
  ET_MATCH_EXACT = 2     /* every field of the fingerprint the configuration was tuned on */
};

typedef struct {
  const char* ort_library; /* path of libonnxruntime.so; NULL: "libonnxruntime.so" on the loader's search path */
  const char* shape;       /* the shape point's key ("input=1x3x96x96"), NULL: the first one */
  int min_match;           /* refuse to open below this ET_MATCH_* level (an app: ET_MATCH_FALLBACK) */
  const char* profile_prefix; /* non-NULL: onnxruntime profiling to this prefix (et_placement uses it) */
} et_open_options;

/* Open the artifact directory (the one holding config.json). NULL on error, with a one-line
 * message in err: a missing or altered file, an unknown shape point, a device below min_match,
 * an onnxruntime that cannot create the session. */
et_session* et_open(const char* artifact_dir, const et_open_options* opts, char* err, size_t errlen);
void et_close(et_session* s);

int et_match(const et_session* s);              /* ET_MATCH_* */
const char* et_match_name(const et_session* s); /* "exact" | "hardware" | "fallback" */
const char* et_device(const et_session* s);     /* the tuned device it matched; "" for the fallback */
const char* et_config_id(const et_session* s);  /* the configuration's id in config.json */
const char* et_config_json(const et_session* s); /* the configuration as JSON */
const char* et_fingerprint_json_of(const et_session* s); /* this device's fingerprint as the loader read it */
const char* et_onnxruntime_version(const et_session* s);

/* the model's inputs and outputs at the chosen shape point (C order, dense) */
int et_num_inputs(const et_session* s);
int et_num_outputs(const et_session* s);
const char* et_input_name(const et_session* s, int i);
const char* et_output_name(const et_session* s, int i);
size_t et_input_bytes(const et_session* s, int i);
size_t et_output_bytes(const et_session* s, int i);

/* One inference: inputs[i] holds et_input_bytes(s, i) bytes, outputs[i] room for
 * et_output_bytes(s, i). 0 on success, else -1 with a message in err. */
int et_run(et_session* s, const void* const* inputs, void* const* outputs, char* err, size_t errlen);

/* Run the artifact's golden inputs for this shape point and compare the outputs with the golden
 * outputs under the artifact's tolerances (the same rule edgetune verifies with). Writes a JSON
 * report to report (truncated to report_len) and, when out_dir is non-NULL, the outputs as
 * out_dir/output_<i>.npy. Returns 0 when every output is within tolerance, 1 when one is not,
 * -1 on an error (message in err). */
int et_selftest(et_session* s, const char* out_dir, char* report, size_t report_len, char* err, size_t errlen);

/* Time et_run on the golden inputs: warmup runs, then runs until both min_iters and budget_ms
 * are reached (at most max_samples). Fills samples_ns; returns how many, or -1 (err). */
int et_bench(et_session* s, int warmup, int min_iters, double budget_ms, int64_t* samples_ns, int max_samples,
             char* err, size_t errlen);

/* Which execution provider ran each node: one profiled run in a second session with the same
 * options. Writes {"intended": provider, "nodes": {provider: count}} to out. 0, or -1 (err). */
int et_placement(et_session* s, const char* work_dir, char* out, size_t outlen, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
