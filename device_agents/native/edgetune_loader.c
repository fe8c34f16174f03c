/* edgetune's app loader (edgetune_loader.h): config.json -> fingerprint match -> sha256-checked
 * files -> an onnxruntime session with the selected configuration. C11, libc + dlopen only.
 * The artifact layout and the config.json schema are in docs/export.md. */
#include "loader_internal.h"

int ld_fail(char* err, size_t errlen, const char* fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ------------------------------------------------------------------ open / close */

char* ld_slurp(const char* path, size_t max, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  char* buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      if (cap > max) { free(buf); fclose(f); return NULL; }
      cap = cap ? cap * 2 : 65536;
      char* nb = (char*)realloc(buf, cap);
      if (!nb) { free(buf); fclose(f); return NULL; }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    if (!got) break;
    n += got;
  }
  fclose(f);
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

API et_session* et_open(const char* artifact_dir, const et_open_options* opts, char* err, size_t errlen) {
  et_open_options dflt = {NULL, NULL, ET_MATCH_FALLBACK, NULL};
  if (!opts) opts = &dflt;
  et_session* s = (et_session*)calloc(1, sizeof *s);
  if (!s) { ld_fail(err, errlen, "out of memory"); return NULL; }
  snprintf(s->dir, sizeof s->dir, "%s", artifact_dir && *artifact_dir ? artifact_dir : ".");
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.json", s->dir);
  char* text = ld_slurp(path, 64u << 20, NULL);
  if (!text) { ld_fail(err, errlen, "%s is missing or unreadable (not an edgetune artifact?)", path); goto bad; }
  char perr[256];
  s->doc = json_parse(text, perr, sizeof perr);
  free(text);
  if (!s->doc) { ld_fail(err, errlen, "config.json is not valid JSON: %s", perr); goto bad; }
  if (!ld_same_str(json_get(s->doc, "schema"), CONFIG_SCHEMA)) {
    ld_fail(err, errlen, "config.json is not of schema %s", CONFIG_SCHEMA);
    goto bad;
  }

  /* the device: the best-matching tuned one, else the fallback */
  et_fingerprint me;
  et_fingerprint_collect(&me);
  {
    sbuf fb;
    sb_init(&fb);
    sb_raw(&fb, "{\"arch\":");
    sb_str(&fb, me.arch);
    sb_raw(&fb, ",\"fields\":");
    et_fingerprint_json(&fb, &me);
    sb_raw(&fb, "}");
    snprintf(s->fp_text, sizeof s->fp_text, "%s", fb.p ? fb.p : "{}");
    sb_free(&fb);
  }
  const jval* devices = json_get(s->doc, "devices");
  const jval* best = NULL;
  s->match = ET_MATCH_FALLBACK;
  for (size_t i = 0; devices && devices->type == J_ARR && i < devices->n; i++) {
    int m = ld_match_level(json_get(devices->items[i], "fingerprint"), &me);
    if (m > s->match) { s->match = m; best = devices->items[i]; }
  }

  /* the shape point */
  const jval* shapes = json_get(s->doc, "shapes");
  if (!shapes || shapes->type != J_ARR || shapes->n == 0) { ld_fail(err, errlen, "config.json lists no shape points"); goto bad; }
  for (size_t i = 0; i < shapes->n && !s->shape; i++)
    if (!opts->shape || ld_same_str(json_get(shapes->items[i], "shape_key"), opts->shape)) s->shape = shapes->items[i];
  if (!s->shape) { ld_fail(err, errlen, "the artifact has no shape point '%s'", opts->shape); goto bad; }
  const char* shape_key = ld_str_or(json_get(s->shape, "shape_key"), "");

  /* the configuration: the device's for that shape point, else the fallback */
  const char* cid = NULL;
  if (best) {
    snprintf(s->device, sizeof s->device, "%s", ld_str_or(json_get(best, "name"), ""));
    const jval* sel = json_get(best, "selected");
    for (size_t i = 0; sel && sel->type == J_ARR && i < sel->n && !cid; i++)
      if (ld_same_str(json_get(sel->items[i], "shape_key"), shape_key)) {
        cid = json_str(json_get(sel->items[i], "config"));
        s->accuracy = json_get(sel->items[i], "accuracy");
        if (s->accuracy && s->accuracy->type != J_OBJ) s->accuracy = NULL;
      }
  }
  if (!cid) {
    cid = json_str(json_get(json_get(s->doc, "fallback"), "config"));
    s->accuracy = NULL;
    if (best) s->match = ET_MATCH_FALLBACK; /* that device was not tuned at this shape point */
    s->device[0] = 0;
  }
  if (s->match < opts->min_match) {
    if (best && !s->device[0])
      ld_fail(err, errlen, "this device matches '%s' at the '%s' level, but that device was not tuned at shape point %s",
           ld_str_or(json_get(best, "name"), "?"), ld_level_name(ld_match_level(json_get(best, "fingerprint"), &me)), shape_key);
    else
      ld_fail(err, errlen, "this device (%s, %s, %d cores, kernel %s) matches none of the artifact's devices at the '%s' "
           "level (best: %s); it was tuned on %zu other device(s)", me.cpu_model, me.arch, me.cores, me.kernel,
           ld_level_name(opts->min_match), ld_level_name(s->match), devices && devices->type == J_ARR ? devices->n : 0);
    goto bad;
  }
  if (!cid) { ld_fail(err, errlen, "config.json has no fallback configuration"); goto bad; }
  snprintf(s->config_id, sizeof s->config_id, "%s", cid);
  s->config = json_get(json_get(s->doc, "configs"), cid);
  if (!s->config || s->config->type != J_OBJ) { ld_fail(err, errlen, "config.json: configuration '%s' is missing", cid); goto bad; }
  {
    const char* runtime = ld_str_or(json_get(s->config, "runtime"), "");
    if (strcmp(runtime, "onnxruntime")) {
      ld_fail(err, errlen, "configuration '%s' runs on '%s'; this loader runs onnxruntime configurations", cid, runtime);
      goto bad;
    }
  }
  if (ld_check_files(s, json_get(s->config, "files"), err, errlen)) goto bad;
  if (ld_join(s, json_str(json_get(s->config, "model")), s->model_path, sizeof s->model_path, err, errlen)) goto bad;
  if (!ld_listed(json_get(s->config, "files"), json_str(json_get(s->config, "model")))) {
    ld_fail(err, errlen, "configuration '%s': its model is not among the files whose sha256 config.json lists", cid);
    goto bad;
  }
  {
    const char* lib = json_str(json_get(s->config, "custom_ops_library"));
    if (lib && ld_join(s, lib, s->ops_lib, sizeof s->ops_lib, err, errlen)) goto bad;
    if (lib && !ld_listed(json_get(s->config, "files"), lib)) {
      ld_fail(err, errlen, "configuration '%s': its custom-op library is not among the files whose sha256 config.json lists", cid);
      goto bad;
    }
  }
  snprintf(s->provider, sizeof s->provider, "%s", ld_str_or(json_get(s->config, "execution_provider"), "CPUExecutionProvider"));
  if (ld_parse_io(json_get(s->shape, "inputs"), s->in, &s->n_in, "inputs", err, errlen) ||
      ld_parse_io(json_get(s->shape, "outputs"), s->out, &s->n_out, "outputs", err, errlen))
    goto bad;
  for (int i = 0; i < s->n_in; i++) s->in_names[i] = s->in[i].name;
  for (int i = 0; i < s->n_out; i++) s->out_names[i] = s->out[i].name;
  {
    sbuf cb;
    sb_init(&cb);
    sb_raw(&cb, "{\"id\":");
    sb_str(&cb, cid);
    sb_raw(&cb, ",\"execution_provider\":");
    sb_str(&cb, s->provider);
    double v;
    if (!ld_num_of(json_get(s->config, "intra_op_num_threads"), &v)) sb_printf(&cb, ",\"intra_op_num_threads\":%d", (int)v);
    if (!ld_num_of(json_get(s->config, "graph_optimization_level"), &v)) sb_printf(&cb, ",\"graph_optimization_level\":%d", (int)v);
    sb_raw(&cb, ",\"execution_mode\":");
    sb_str(&cb, json_str(json_get(s->config, "execution_mode")));
    sb_raw(&cb, ",\"model\":");
    sb_str(&cb, json_str(json_get(s->config, "model")));
    sb_raw(&cb, "}");
    s->config_text = cb.p; /* owned */
  }

  if (ld_load_ort(s, opts->ort_library, err, errlen)) goto bad;
  if (ld_create_session(s, opts->profile_prefix, &s->sess, err, errlen)) goto bad;
  if (ld_ort_check(s, ORT_FN(s->api, ORT_CreateCpuMemoryInfo, OrtCreateCpuMemoryInfoFn)(OrtDeviceAllocator, OrtMemTypeDefault, &s->mem),
                "CreateCpuMemoryInfo", err, errlen))
    goto bad;
  return s;
bad:
  et_close(s);
  return NULL;
}

API void et_close(et_session* s) {
  if (!s) return;
  if (s->api) {
    if (s->sess) ORT_FN(s->api, ORT_ReleaseSession, OrtReleaseFn)(s->sess);
    if (s->mem) ORT_FN(s->api, ORT_ReleaseMemoryInfo, OrtReleaseFn)(s->mem);
    if (s->env) ORT_FN(s->api, ORT_ReleaseEnv, OrtReleaseFn)(s->env);
  }
  for (int i = 0; i < MAX_IO; i++) tensor_free(&s->golden_in[i]);
  if (s->doc) json_free(s->doc);
  free(s->config_text);
  /* the onnxruntime library stays loaded: its threads may outlive the session by a moment */
  free(s);
}

API int et_match(const et_session* s) { return s->match; }
API const char* et_match_name(const et_session* s) { return ld_level_name(s->match); }
API const char* et_device(const et_session* s) { return s->device; }
API const char* et_config_id(const et_session* s) { return s->config_id; }
API const char* et_config_json(const et_session* s) { return s->config_text ? s->config_text : "{}"; }
API const char* et_fingerprint_json_of(const et_session* s) { return s->fp_text; }
API const char* et_onnxruntime_version(const et_session* s) { return s->version; }
API int et_num_inputs(const et_session* s) { return s->n_in; }
API int et_num_outputs(const et_session* s) { return s->n_out; }
API const char* et_input_name(const et_session* s, int i) { return i >= 0 && i < s->n_in ? s->in[i].name : NULL; }
API const char* et_output_name(const et_session* s, int i) { return i >= 0 && i < s->n_out ? s->out[i].name : NULL; }
API size_t et_input_bytes(const et_session* s, int i) { return i >= 0 && i < s->n_in ? s->in[i].nbytes : 0; }
API size_t et_output_bytes(const et_session* s, int i) { return i >= 0 && i < s->n_out ? s->out[i].nbytes : 0; }

/* ------------------------------------------------------------------ run */


int ld_run_session(et_session* s, OrtSession* sess, const void* const* inputs, void* const* outputs, char* err,
                   size_t errlen) {
  OrtValue* iv[MAX_IO] = {0};
  OrtValue* ov[MAX_IO] = {0};
  OrtCreateTensorWithDataFn wrap = ORT_FN(s->api, ORT_CreateTensorWithDataAsOrtValue, OrtCreateTensorWithDataFn);
  OrtReleaseFn rel = ORT_FN(s->api, ORT_ReleaseValue, OrtReleaseFn);
  int rc = 0;
  for (int i = 0; i < s->n_in && !rc; i++)
    rc = ld_ort_check(s, wrap(s->mem, (void*)inputs[i], s->in[i].nbytes, s->in[i].shape, (size_t)s->in[i].ndim,
                           et_onnx_type(s->in[i].dtype), &iv[i]), "input", err, errlen);
  for (int i = 0; i < s->n_out && !rc; i++)
    rc = ld_ort_check(s, wrap(s->mem, outputs[i], s->out[i].nbytes, s->out[i].shape, (size_t)s->out[i].ndim,
                           et_onnx_type(s->out[i].dtype), &ov[i]), "output", err, errlen);
  if (!rc)
    rc = ld_ort_check(s, ORT_FN(s->api, ORT_Run, OrtRunFn)(sess, NULL, s->in_names, (const OrtValue* const*)iv, (size_t)s->n_in,
                                                        s->out_names, (size_t)s->n_out, ov),
                   "Run", err, errlen);
  /* onnxruntime writes into a pre-bound output only when it matches; make sure it did */
  for (int i = 0; i < s->n_out && !rc; i++) {
    void* p = NULL;
    rc = ld_ort_check(s, ORT_FN(s->api, ORT_GetTensorMutableData, OrtGetTensorMutableDataFn)(ov[i], &p), "output", err, errlen);
    if (!rc && p != outputs[i]) rc = ld_fail(err, errlen, "onnxruntime did not write output '%s' into the caller's buffer", s->out[i].name);
  }
  for (int i = 0; i < MAX_IO; i++) {
    if (iv[i]) rel(iv[i]);
    if (ov[i]) rel(ov[i]);
  }
  return rc;
}

API int et_run(et_session* s, const void* const* inputs, void* const* outputs, char* err, size_t errlen) {
  return ld_run_session(s, s->sess, inputs, outputs, err, errlen);
}
