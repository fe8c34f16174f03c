/* The bundle run-stdio streams to the host: result.json (the worker's, or one the supervisor
 * synthesises) and every output file, within max_bundle_bytes. */
#include "supervisor.h"

static int bundle_name(const char* n) { /* the host's file-name rule, .npy only */
  size_t len = strlen(n);
  if (len < 5 || len > 128 || strcmp(n + len - 4, ".npy") || !(isalnum((unsigned char)n[0]) || n[0] == '_')) return 0;
  for (size_t i = 0; i < len; i++)
    if (!(isalnum((unsigned char)n[i]) || n[i] == '_' || n[i] == '.' || n[i] == '-')) return 0;
  return 1;
}

typedef struct {
  char name[136];
  long long size; /* bytes taken from the file */
} bundle_file;

static int digits(long long v) {
  int d = 1;
  while (v >= 10) { v /= 10; d++; }
  return d;
}

/* exactly n bytes of a file to stdout (the job is dead: nothing changes the file any more) */
static void copy_out(const char* path, long long n) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  char buf[65536];
  while (n > 0) {
    ssize_t got = fd >= 0 ? read(fd, buf, n < (long long)sizeof buf ? (size_t)n : sizeof buf) : 0;
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) { /* cannot happen; keep the framing whatever */
      memset(buf, 0, sizeof buf);
      got = n < (long long)sizeof buf ? (ssize_t)n : (ssize_t)sizeof buf;
    }
    fwrite(buf, 1, (size_t)got, stdout);
    n -= got;
  }
  if (fd >= 0) close(fd);
}

static void emit_synthesised(const supervisor* sv) {
  sbuf o;
  sb_init(&o);
  sb_printf(&o, "{\"protocol\":%d,\"agent\":\"native\",\"agent_version\":", PROTOCOL);
  sb_str(&o, ET_AGENT_VERSION);
  sb_raw(&o, ",\"status\":");
  sb_str(&o, sv->status ? sv->status : "error");
  sb_raw(&o, ",\"reason\":");
  sb_str(&o, sv->reason);
  if (sv->limit) sb_printf(&o, ",\"limit\":\"%s\"", sv->limit);
  if (sv->signal) sb_printf(&o, ",\"signal\":\"%s\"", sv->signal);
  sb_raw(&o, ",");
  sv_fields(sv, &o);
  fputs("EDGETUNE-BUNDLE 1\n", stdout);
  printf("result.json %zu\n", o.len);
  fwrite(o.p, 1, o.len, stdout);
  fputs("END\n", stdout);
  fflush(stdout);
  sb_free(&o);
}

/* The worker's result.json with the supervisor's fields appended (its last '}' found by scanning back
 * over whitespace: nothing else of it is read) and its outputs, if the whole is at most max_bundle. */
void sv_emit_bundle(supervisor* sv) {
  if (sv->status) {
    emit_synthesised(sv);
    return;
  }
  char path[PATH_MAX + 160], tail[4096];
  snprintf(path, sizeof path, "%s/result.json", sv->jobdir);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    if (fd >= 0) close(fd);
    sv->status = "crashed";
    snprintf(sv->reason, sizeof sv->reason, "crashed: cannot read the worker's result.json");
    emit_synthesised(sv);
    return;
  }
  long long size = (long long)st.st_size, off = size > (long long)sizeof tail ? size - (long long)sizeof tail : 0;
  ssize_t got = sv->lim.max_bundle && size > sv->lim.max_bundle ? 0 : pread(fd, tail, (size_t)(size - off), off);
  close(fd);
  long long end = got > 0 ? got : 0;
  while (end > 0 && isspace((unsigned char)tail[end - 1])) end--;
  long long before = end - 1; /* the closing brace */
  while (before > 0 && isspace((unsigned char)tail[before - 1])) before--;
  if (!(sv->lim.max_bundle && size > sv->lim.max_bundle) && (end == 0 || tail[end - 1] != '}')) {
    sv->status = "crashed";
    snprintf(sv->reason, sizeof sv->reason, "crashed: the worker's result.json is not a JSON object");
    emit_synthesised(sv);
    return;
  }
  long long keep = off + end - 1;
  sbuf suffix;
  sb_init(&suffix);
  sb_raw(&suffix, before > 0 && tail[before - 1] == '{' ? "" : ",");
  sv_fields(sv, &suffix);
  long long rsize = keep + (long long)suffix.len;
  long long total = 18 + 4 + 12 + digits(rsize) + 1 + rsize; /* magic, END, "result.json " ... */
  bundle_file* files = NULL;
  size_t n_files = 0, cap = 0;
  DIR* d = opendir(sv->jobdir);
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (!bundle_name(e->d_name)) continue;
    char p[PATH_MAX + 160];
    snprintf(p, sizeof p, "%s/%s", sv->jobdir, e->d_name);
    if (lstat(p, &st) || !S_ISREG(st.st_mode)) continue; /* regular files only, never a link */
    if (n_files == cap) {
      cap = cap ? cap * 2 : 64;
      bundle_file* nf = (bundle_file*)realloc(files, cap * sizeof *nf);
      if (!nf) break;
      files = nf;
    }
    snprintf(files[n_files].name, sizeof files[n_files].name, "%s", e->d_name);
    files[n_files].size = (long long)st.st_size;
    total += (long long)strlen(e->d_name) + 1 + digits(files[n_files].size) + 1 + files[n_files].size;
    n_files++;
  }
  if (d) closedir(d);
  if (sv->lim.max_bundle && (size > sv->lim.max_bundle || total > sv->lim.max_bundle)) {
    sv_violation(sv, "output", "result too large: the bundle is %lld bytes (limit %lld bytes)",
                 size > total ? size : total, sv->lim.max_bundle);
    emit_synthesised(sv);
  } else {
    fputs("EDGETUNE-BUNDLE 1\n", stdout);
    printf("result.json %lld\n", rsize);
    copy_out(path, keep);
    fwrite(suffix.p, 1, suffix.len, stdout);
    for (size_t i = 0; i < n_files; i++) {
      snprintf(path, sizeof path, "%s/%s", sv->jobdir, files[i].name);
      printf("%s %lld\n", files[i].name, files[i].size);
      copy_out(path, files[i].size);
    }
    fputs("END\n", stdout);
    fflush(stdout);
  }
  free(files);
  sb_free(&suffix);
}
