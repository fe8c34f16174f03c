/* The app loader's checks on the device: et_selftest (the golden inputs against the packaged
 * outputs), et_bench (timing), et_placement (which provider ran each node). */
#include "loader_internal.h"

/* ------------------------------------------------------------------ golden check */

static int load_golden(et_session* s, char* err, size_t errlen) {
  if (s->golden_loaded) return 0;
  const jval* files = json_get(json_get(s->shape, "golden"), "inputs");
  if (!files || files->type != J_ARR || (int)files->n != s->n_in) return ld_fail(err, errlen, "config.json: no golden inputs for this shape point");
  for (int i = 0; i < s->n_in; i++) {
    char path[PATH_MAX], e[256];
    if (ld_join(s, json_str(files->items[i]), path, sizeof path, err, errlen)) return -1;
    if (npy_read(path, &s->golden_in[i], e, sizeof e)) return ld_fail(err, errlen, "golden input %s: %s", json_str(files->items[i]), e);
    et_tensor* t = &s->golden_in[i];
    int same = t->dtype == s->in[i].dtype && t->ndim == s->in[i].ndim && t->nbytes == s->in[i].nbytes;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == s->in[i].shape[d];
    if (!same) return ld_fail(err, errlen, "golden input %s does not have the dtype and shape of input '%s'", json_str(files->items[i]), s->in[i].name);
  }
  s->golden_loaded = 1;
  return 0;
}

static double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(man + 1024, exp - 25);
  return sign ? -v : v;
}

static double element(const et_tensor* t, size_t i) {
  switch (t->dtype) {
    case DT_F32: return ((const float*)t->data)[i];
    case DT_F64: return ((const double*)t->data)[i];
    case DT_F16: return half_to_double(((const uint16_t*)t->data)[i]);
    case DT_I8: return ((const int8_t*)t->data)[i];
    case DT_U8: return ((const uint8_t*)t->data)[i];
    case DT_BOOL: return ((const uint8_t*)t->data)[i];
    case DT_I32: return ((const int32_t*)t->data)[i];
    case DT_I64: return (double)((const int64_t*)t->data)[i];
    default: return NAN;
  }
}

/* edgetune's tolerance rule (edgetune/verify.py compare): |y - r| <= atol * rms(r) + rtol * |r| for
 * every element, and ||y - r|| / ||r|| <= norm; a non-finite reference must be matched exactly */
typedef struct {
  double max_abs, norm_rel, worst_ratio, cosine;
  int within;
} errstats;

static errstats compare(const et_tensor* y, const et_tensor* r, double atol, double rtol, double norm) {
  errstats e = {0, 0, 0, 1, 1};
  size_t n = r->nbytes / dtype_size(r->dtype);
  double ss = 0, dd = 0, yy = 0, yr = 0;
  size_t finite = 0;
  for (size_t i = 0; i < n; i++) {
    double rv = element(r, i);
    if (isfinite(rv)) { ss += rv * rv; finite++; }
  }
  double scale = n ? sqrt(ss / (double)n) : 0;
  for (size_t i = 0; i < n; i++) {
    double yv = element(y, i), rv = element(r, i);
    double diff = isfinite(rv) ? fabs(yv - rv) : (yv == rv ? 0 : INFINITY);
    if (isnan(diff)) diff = INFINITY;
    if (diff > e.max_abs) e.max_abs = diff;
    double rf = isfinite(rv) ? rv : 0;
    dd += diff * diff;
    yy += (isfinite(yv) ? yv * yv : INFINITY);
    yr += (isfinite(yv) ? yv : 0) * rf;
    double bound = atol * scale + rtol * fabs(rf);
    double ratio = diff == 0 ? 0 : bound > 0 ? diff / bound : INFINITY;
    if (ratio > e.worst_ratio) e.worst_ratio = ratio;
  }
  (void)finite;
  double rn = sqrt(ss);
  e.norm_rel = rn > 0 ? sqrt(dd) / rn : (dd == 0 ? 0 : INFINITY);
  e.cosine = (rn > 0 && yy > 0 && isfinite(yy)) ? yr / (sqrt(yy) * rn) : (dd == 0 ? 1 : 0);
  e.within = e.worst_ratio <= 1.0 && e.norm_rel <= norm;
  return e;
}

API int et_selftest(et_session* s, const char* out_dir, char* report, size_t report_len, char* err, size_t errlen) {
  if (load_golden(s, err, errlen)) return -1;
  const jval* golden = json_get(s->shape, "golden");
  const jval* gout = json_get(golden, "outputs");
  const jval* tols = json_get(golden, "tolerance");
  if (!gout || gout->type != J_ARR || (int)gout->n != s->n_out || !tols || tols->type != J_ARR || (int)tols->n != s->n_out)
    return ld_fail(err, errlen, "config.json: no golden outputs or tolerances for this shape point");
  et_tensor outs[MAX_IO], refs[MAX_IO];
  memset(outs, 0, sizeof outs);
  memset(refs, 0, sizeof refs);
  int rc = 0;
  const void* in_ptrs[MAX_IO];
  void* out_ptrs[MAX_IO];
  for (int i = 0; i < s->n_in; i++) in_ptrs[i] = s->golden_in[i].data;
  for (int i = 0; i < s->n_out && !rc; i++) {
    if (tensor_alloc(&outs[i], s->out[i].dtype, s->out[i].ndim, s->out[i].shape)) rc = ld_fail(err, errlen, "out of memory");
    else {
      tensor_poison(&outs[i]); /* an output the session skips cannot pass as the golden one */
      out_ptrs[i] = outs[i].data;
    }
  }
  if (!rc) rc = et_run(s, in_ptrs, out_ptrs, err, errlen);
  sbuf o;
  sb_init(&o);
  int all_ok = 1;
  sb_raw(&o, "{\"outputs\":[");
  for (int i = 0; i < s->n_out && !rc; i++) {
    char path[PATH_MAX], e[256];
    const char* rel = json_str(gout->items[i]);
    if (ld_join(s, rel, path, sizeof path, err, errlen)) { rc = -1; break; }
    if (npy_read(path, &refs[i], e, sizeof e)) { rc = ld_fail(err, errlen, "golden output %s: %s", rel, e); break; }
    if (refs[i].dtype != outs[i].dtype || refs[i].nbytes != outs[i].nbytes) {
      rc = ld_fail(err, errlen, "golden output %s does not have the dtype and size of output '%s'", rel, s->out[i].name);
      break;
    }
    double atol = 0, rtol = 0, norm = 0, mc = -2, ma = -1;
    ld_num_of(json_get(tols->items[i], "atol"), &atol);
    ld_num_of(json_get(tols->items[i], "rtol"), &rtol);
    ld_num_of(json_get(tols->items[i], "norm"), &norm);
    errstats st = compare(&outs[i], &refs[i], atol, rtol, norm);
    int ok = st.within;
    const char* rule = "tolerance";
    if (s->accuracy) { /* an approximate configuration: held to the accuracy budget it was selected under */
      rule = "accuracy budget";
      ok = 1;
      if (!ld_num_of(json_get(s->accuracy, "cosine"), &mc)) ok &= st.cosine >= mc;
      if (!ld_num_of(json_get(s->accuracy, "max_abs"), &ma)) ok &= st.max_abs <= ma;
    }
    all_ok &= ok;
    sb_printf(&o, "%s{\"name\":", i ? "," : "");
    sb_str(&o, s->out[i].name);
    sb_printf(&o, ",\"ok\":%s,\"rule\":\"%s\",\"max_abs\":", ok ? "true" : "false", rule);
    sb_double(&o, st.max_abs);
    sb_raw(&o, ",\"norm_rel\":");
    sb_double(&o, st.norm_rel);
    sb_raw(&o, ",\"worst_ratio\":");
    sb_double(&o, st.worst_ratio);
    sb_raw(&o, ",\"cosine\":");
    sb_double(&o, st.cosine);
    sb_raw(&o, "}");
    if (out_dir) {
      snprintf(path, sizeof path, "%s/output_%d.npy", out_dir, i);
      if (npy_write(path, &outs[i], e, sizeof e)) { rc = ld_fail(err, errlen, "writing %s: %s", path, e); break; }
    }
  }
  sb_printf(&o, "],\"ok\":%s}", all_ok ? "true" : "false");
  if (!rc && report && report_len) snprintf(report, report_len, "%s", o.p ? o.p : "{}");
  sb_free(&o);
  for (int i = 0; i < MAX_IO; i++) {
    tensor_free(&outs[i]);
    tensor_free(&refs[i]);
  }
  return rc ? -1 : (all_ok ? 0 : 1);
}

/* ------------------------------------------------------------------ timing */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

API int et_bench(et_session* s, int warmup, int min_iters, double budget_ms, int64_t* samples_ns, int max_samples,
                 char* err, size_t errlen) {
  if (load_golden(s, err, errlen)) return -1;
  et_tensor outs[MAX_IO];
  memset(outs, 0, sizeof outs);
  const void* in_ptrs[MAX_IO];
  void* out_ptrs[MAX_IO];
  int rc = 0, n = 0;
  for (int i = 0; i < s->n_in; i++) in_ptrs[i] = s->golden_in[i].data;
  for (int i = 0; i < s->n_out && !rc; i++) {
    if (tensor_alloc(&outs[i], s->out[i].dtype, s->out[i].ndim, s->out[i].shape)) rc = ld_fail(err, errlen, "out of memory");
    out_ptrs[i] = outs[i].data;
  }
  for (int i = 0; i < warmup && !rc; i++) rc = et_run(s, in_ptrs, out_ptrs, err, errlen);
  int64_t start = now_ns();
  while (!rc && n < max_samples && (n < min_iters || (double)(now_ns() - start) < budget_ms * 1e6)) {
    int64_t t0 = now_ns();
    rc = et_run(s, in_ptrs, out_ptrs, err, errlen);
    samples_ns[n++] = now_ns() - t0;
  }
  for (int i = 0; i < MAX_IO; i++) tensor_free(&outs[i]);
  return rc ? -1 : n;
}

/* ------------------------------------------------------------------ placement */

static void strip_suffix(char* name) {
  static const char* suffixes[] = {"_kernel_time", "_fence_before", "_fence_after"};
  size_t n = strlen(name);
  for (size_t i = 0; i < 3; i++) {
    size_t k = strlen(suffixes[i]);
    if (n > k && !strcmp(name + n - k, suffixes[i])) { name[n - k] = 0; return; }
  }
}

API int et_placement(et_session* s, const char* work_dir, char* out, size_t outlen, char* err, size_t errlen) {
  if (load_golden(s, err, errlen)) return -1;
  char prefix[PATH_MAX];
  snprintf(prefix, sizeof prefix, "%s/edgetune-placement-%d", work_dir && *work_dir ? work_dir : ".", (int)getpid());
  OrtSession* ps = NULL;
  if (ld_create_session(s, prefix, &ps, err, errlen)) return -1;
  et_tensor outs[MAX_IO];
  memset(outs, 0, sizeof outs);
  const void* in_ptrs[MAX_IO];
  void* out_ptrs[MAX_IO];
  int rc = 0;
  for (int i = 0; i < s->n_in; i++) in_ptrs[i] = s->golden_in[i].data;
  for (int i = 0; i < s->n_out && !rc; i++) {
    if (tensor_alloc(&outs[i], s->out[i].dtype, s->out[i].ndim, s->out[i].shape)) rc = ld_fail(err, errlen, "out of memory");
    out_ptrs[i] = outs[i].data;
  }
  if (!rc) rc = ld_run_session(s, ps, in_ptrs, out_ptrs, err, errlen);
  char* file = NULL;
  OrtAllocator* alloc = NULL;
  if (!rc) rc = ld_ort_check(s, ORT_FN(s->api, ORT_GetAllocatorWithDefaultOptions, OrtGetAllocatorFn)(&alloc), "allocator", err, errlen);
  if (!rc) rc = ld_ort_check(s, ORT_FN(s->api, ORT_SessionEndProfiling, OrtSessionEndProfilingFn)(ps, alloc, &file),
                          "SessionEndProfiling", err, errlen);
  ORT_FN(s->api, ORT_ReleaseSession, OrtReleaseFn)(ps);
  for (int i = 0; i < MAX_IO; i++) tensor_free(&outs[i]);
  if (rc) return -1;
  char* text = ld_slurp(file, 256u << 20, NULL);
  if (text) unlink(file);
  char fname[PATH_MAX];
  snprintf(fname, sizeof fname, "%s", file);
  ORT_FN(s->api, ORT_AllocatorFree, OrtAllocatorFreeFn)(alloc, file);
  if (!text) return ld_fail(err, errlen, "cannot read onnxruntime's profile %s", fname);
  char perr[128];
  jval* ev = json_parse(text, perr, sizeof perr);
  free(text);
  if (!ev || ev->type != J_ARR) {
    json_free(ev);
    return ld_fail(err, errlen, "onnxruntime's profile is not a JSON array: %s", perr);
  }
  /* node name -> provider; then providers -> node counts */
  char** names = (char**)calloc(ev->n + 1, sizeof(char*));
  const char** provs = (const char**)calloc(ev->n + 1, sizeof(char*));
  size_t nn = 0;
  for (size_t i = 0; names && provs && i < ev->n; i++) {
    const jval* e = ev->items[i];
    const char* prov = json_str(json_get(json_get(e, "args"), "provider"));
    if (!ld_same_str(json_get(e, "cat"), "Node") || !prov || !*prov) continue;
    char name[512];
    snprintf(name, sizeof name, "%s", ld_str_or(json_get(e, "name"), ""));
    strip_suffix(name);
    size_t k = 0;
    while (k < nn && strcmp(names[k], name)) k++;
    if (k == nn) names[nn++] = strdup(name);
    provs[k] = prov;
  }
  sbuf o;
  sb_init(&o);
  sb_raw(&o, "{\"intended\":");
  sb_str(&o, s->provider);
  sb_raw(&o, ",\"nodes\":{");
  int first = 1;
  for (size_t k = 0; k < nn; k++) {
    int seen = 0;
    for (size_t j = 0; j < k; j++) seen |= !strcmp(provs[j], provs[k]);
    if (seen) continue;
    int count = 0;
    for (size_t j = k; j < nn; j++) count += !strcmp(provs[j], provs[k]);
    if (!first) sb_raw(&o, ",");
    first = 0;
    sb_str(&o, provs[k]);
    sb_printf(&o, ":%d", count);
  }
  sb_raw(&o, "}}");
  snprintf(out, outlen, "%s", o.p ? o.p : "{}");
  sb_free(&o);
  for (size_t k = 0; k < nn; k++) free(names[k]);
  free(names);
  free(provs);
  json_free(ev);
  return 0;
}
