/* The app loader's config.json (paths, listed files, inputs and outputs) and fingerprint match. */
#include "loader_internal.h"

/* ------------------------------------------------------------------ config.json */

const char* ld_str_or(const jval* v, const char* dflt) {
  const char* s = json_str(v);
  return s ? s : dflt;
}

int ld_num_of(const jval* v, double* out) { return v && v->type == J_NUM ? (*out = v->num, 0) : -1; }

/* a path inside the artifact: relative, no "..", no empty part */
static int safe_rel(const char* p) {
  if (!p || !*p || p[0] == '/') return 0;
  const char* q = p;
  while (*q) {
    const char* slash = strchr(q, '/');
    size_t n = slash ? (size_t)(slash - q) : strlen(q);
    if (n == 0 || (n == 1 && q[0] == '.') || (n == 2 && q[0] == '.' && q[1] == '.')) return 0;
    q += n + (slash ? 1 : 0);
  }
  return 1;
}

int ld_join(const et_session* s, const char* rel, char* out, size_t outlen, char* err, size_t errlen) {
  if (!safe_rel(rel)) return ld_fail(err, errlen, "config.json names a file outside the artifact: '%s'", rel ? rel : "(none)");
  if ((size_t)snprintf(out, outlen, "%s/%s", s->dir, rel) >= outlen) return ld_fail(err, errlen, "path too long: %s", rel);
  return 0;
}

/* every file the configuration reads, checked against config.json's sha256 before onnxruntime sees it */
int ld_check_files(et_session* s, const jval* files, char* err, size_t errlen) {
  if (!files || files->type != J_ARR || files->n == 0)
    return ld_fail(err, errlen, "config.json: configuration '%s' lists no files", s->config_id);
  for (size_t i = 0; i < files->n; i++) {
    const char* rel = json_str(json_get(files->items[i], "path"));
    const char* want = json_str(json_get(files->items[i], "sha256"));
    char path[PATH_MAX], hex[65];
    if (ld_join(s, rel, path, sizeof path, err, errlen)) return -1;
    if (!want || strlen(want) != 64) return ld_fail(err, errlen, "config.json: file '%s' has no sha256", rel);
    if (sha256_file_hex(path, hex)) return ld_fail(err, errlen, "artifact file %s is missing or unreadable", rel);
    if (strcmp(hex, want))
      return ld_fail(err, errlen, "artifact file %s is altered: sha256 %.12s..., config.json says %.12s...", rel, hex, want);
  }
  return 0;
}

int ld_same_str(const jval* v, const char* mine) {
  const char* s = json_str(v);
  if (!s || !*s) return !mine || !*mine; /* null and "" are the same absence */
  return mine && !strcmp(s, mine);
}

/* a code or model file the session loads must be one whose sha256 was checked */
int ld_listed(const jval* files, const char* rel) {
  for (size_t i = 0; rel && files && files->type == J_ARR && i < files->n; i++)
    if (ld_same_str(json_get(files->items[i], "path"), rel)) return 1;
  return 0;
}

int ld_parse_io(const jval* list, io_spec* out, int* n, const char* what, char* err, size_t errlen) {
  if (!list || list->type != J_ARR || list->n == 0 || list->n > MAX_IO)
    return ld_fail(err, errlen, "config.json: shape point has no %s", what);
  *n = (int)list->n;
  for (size_t i = 0; i < list->n; i++) {
    const jval* e = list->items[i];
    const char* name = json_str(json_get(e, "name"));
    const char* dt = json_str(json_get(e, "dtype"));
    const jval* shape = json_get(e, "shape");
    if (!name || !dt || !shape || shape->type != J_ARR || shape->n > ET_MAX_NDIM)
      return ld_fail(err, errlen, "config.json: a malformed %s entry", what);
    io_spec* o = &out[i];
    snprintf(o->name, sizeof o->name, "%s", name);
    o->dtype = dtype_from_name(dt);
    if (o->dtype == DT_INVALID) return ld_fail(err, errlen, "config.json: %s '%s' has dtype %s, which the loader does not run", what, name, dt);
    o->ndim = (int)shape->n;
    size_t count = 1;
    for (size_t d = 0; d < shape->n; d++) {
      double v;
      if (ld_num_of(shape->items[d], &v) || v < 0 || v != floor(v))
        return ld_fail(err, errlen, "config.json: %s '%s' has a non-static shape", what, name);
      o->shape[d] = (int64_t)v;
      count *= (size_t)v;
    }
    o->nbytes = count * dtype_size(o->dtype);
  }
  return 0;
}

/* ------------------------------------------------------------------ fingerprint match */


int ld_match_level(const jval* fp, const et_fingerprint* me) {
  if (!fp || fp->type != J_OBJ) return ET_MATCH_FALLBACK;
  double cores;
  if (!ld_same_str(json_get(fp, "arch"), me->arch)) return ET_MATCH_FALLBACK;
  if (!ld_same_str(json_get(fp, "cpu_model"), me->cpu_model) && !ld_same_str(json_get(fp, "cpu_model"), me->cpu_model_py))
    return ET_MATCH_FALLBACK;
  if (ld_num_of(json_get(fp, "cores"), &cores) || ((int)cores != me->cores && (int)cores != me->cores_online))
    return ET_MATCH_FALLBACK;
  const jval* f = json_get(fp, "max_freq_khz");
  if (f && f->type == J_ARR) {
    if ((int)f->n != me->n_freq) return ET_MATCH_FALLBACK;
    for (size_t i = 0; i < f->n; i++) {
      double v;
      if (ld_num_of(f->items[i], &v) || (long long)v != me->max_freq_khz[i]) return ET_MATCH_FALLBACK;
    }
  }
  if (!ld_same_str(json_get(fp, "kernel"), me->kernel) || !ld_same_str(json_get(fp, "os"), me->os) ||
      !ld_same_str(json_get(fp, "governor"), me->governor) || !ld_same_str(json_get(fp, "emulated"), me->emulated) ||
      (!ld_same_str(json_get(fp, "soc"), me->soc) && !ld_same_str(json_get(fp, "soc"), me->soc_py)))
    return ET_MATCH_HARDWARE;
  return ET_MATCH_EXACT;
}

const char* ld_level_name(int m) {
  return m == ET_MATCH_EXACT ? "exact" : m == ET_MATCH_HARDWARE ? "hardware" : "fallback";
}
