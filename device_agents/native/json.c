#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char* p;
  char* err;
  size_t errlen;
  int depth;
} parser;

static jval* fail(parser* ps, const char* what) {
  if (ps->err && !ps->err[0]) snprintf(ps->err, ps->errlen, "invalid JSON: %s", what);
  return NULL;
}

static void skip_ws(parser* ps) {
  while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') ps->p++;
}

static jval* new_val(jtype t) {
  jval* v = (jval*)calloc(1, sizeof(jval));
  if (v) v->type = t;
  return v;
}

static int hex4(const char* s, unsigned* out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static void put_utf8(char** o, unsigned cp) {
  char* q = *o;
  if (cp < 0x80) { *q++ = (char)cp; }
  else if (cp < 0x800) { *q++ = (char)(0xC0 | (cp >> 6)); *q++ = (char)(0x80 | (cp & 0x3F)); }
  else if (cp < 0x10000) {
    *q++ = (char)(0xE0 | (cp >> 12)); *q++ = (char)(0x80 | ((cp >> 6) & 0x3F));
    *q++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *q++ = (char)(0xF0 | (cp >> 18)); *q++ = (char)(0x80 | ((cp >> 12) & 0x3F));
    *q++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *q++ = (char)(0x80 | (cp & 0x3F));
  }
  *o = q;
}

/* Decoded string is never longer than its escaped form. */
static char* parse_string_raw(parser* ps) {
  if (*ps->p != '"') return (char*)fail(ps, "expected string");
  const char* s = ++ps->p;
  size_t maxlen = 0;
  while (s[maxlen] && s[maxlen] != '"') {
    if (s[maxlen] == '\\' && s[maxlen + 1]) maxlen++;
    maxlen++;
  }
  if (!s[maxlen]) return (char*)fail(ps, "unterminated string");
  char* out = (char*)malloc(maxlen + 1);
  if (!out) return (char*)fail(ps, "out of memory");
  char* o = out;
  while (*ps->p != '"') {
    unsigned char c = (unsigned char)*ps->p++;
    if (c < 0x20) { free(out); return (char*)fail(ps, "control character in string"); }
    if (c != '\\') { *o++ = (char)c; continue; }
    char e = *ps->p++;
    switch (e) {
      case '"': *o++ = '"'; break;
      case '\\': *o++ = '\\'; break;
      case '/': *o++ = '/'; break;
      case 'b': *o++ = '\b'; break;
      case 'f': *o++ = '\f'; break;
      case 'n': *o++ = '\n'; break;
      case 'r': *o++ = '\r'; break;
      case 't': *o++ = '\t'; break;
      case 'u': {
        unsigned cp;
        if (hex4(ps->p, &cp)) { free(out); return (char*)fail(ps, "bad \\u escape"); }
        ps->p += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && ps->p[0] == '\\' && ps->p[1] == 'u') {
          unsigned lo;
          if (!hex4(ps->p + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            ps->p += 6;
          }
        }
        put_utf8(&o, cp);
        break;
      }
      default: free(out); return (char*)fail(ps, "bad escape");
    }
  }
  ps->p++;
  *o = 0;
  return out;
}

static jval* parse_value(parser* ps);

static int push(jval* v, jval* item, char* key) {
  if ((v->n & (v->n - 1)) == 0) { /* grow at powers of two */
    size_t cap = v->n ? v->n * 2 : 1;
    jval** ni = (jval**)realloc(v->items, cap * sizeof(jval*));
    if (!ni) return -1;
    v->items = ni;
    if (v->type == J_OBJ) {
      char** nk = (char**)realloc(v->keys, cap * sizeof(char*));
      if (!nk) return -1;
      v->keys = nk;
    }
  }
  v->items[v->n] = item;
  if (v->type == J_OBJ) v->keys[v->n] = key;
  v->n++;
  return 0;
}

static jval* parse_container(parser* ps, jtype t) {
  char close = t == J_ARR ? ']' : '}';
  if (++ps->depth > 64) return fail(ps, "nesting too deep");
  jval* v = new_val(t);
  if (!v) return fail(ps, "out of memory");
  ps->p++;
  skip_ws(ps);
  if (*ps->p == close) { ps->p++; ps->depth--; return v; }
  for (;;) {
    char* key = NULL;
    skip_ws(ps);
    if (t == J_OBJ) {
      key = parse_string_raw(ps);
      if (!key) goto bad;
      skip_ws(ps);
      if (*ps->p != ':') { free(key); fail(ps, "expected ':'"); goto bad; }
      ps->p++;
    }
    jval* item = parse_value(ps);
    if (!item) { free(key); goto bad; }
    if (push(v, item, key)) { free(key); json_free(item); fail(ps, "out of memory"); goto bad; }
    skip_ws(ps);
    if (*ps->p == ',') { ps->p++; continue; }
    if (*ps->p == close) { ps->p++; break; }
    fail(ps, t == J_ARR ? "expected ',' or ']'" : "expected ',' or '}'");
    goto bad;
  }
  ps->depth--;
  return v;
bad:
  json_free(v);
  return NULL;
}

static jval* parse_value(parser* ps) {
  skip_ws(ps);
  char c = *ps->p;
  if (c == '{') return parse_container(ps, J_OBJ);
  if (c == '[') return parse_container(ps, J_ARR);
  if (c == '"') {
    char* s = parse_string_raw(ps);
    if (!s) return NULL;
    jval* v = new_val(J_STR);
    if (!v) { free(s); return fail(ps, "out of memory"); }
    v->str = s;
    return v;
  }
  if (!strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
    jval* v = new_val(J_BOOL);
    if (!v) return fail(ps, "out of memory");
    v->b = c == 't';
    ps->p += v->b ? 4 : 5;
    return v;
  }
  if (!strncmp(ps->p, "null", 4)) {
    ps->p += 4;
    jval* v = new_val(J_NULL);
    return v ? v : fail(ps, "out of memory");
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    char* end;
    double d = strtod(ps->p, &end); /* C locale: the agent never calls setlocale */
    if (end == ps->p) return fail(ps, "bad number");
    ps->p = end;
    jval* v = new_val(J_NUM);
    if (!v) return fail(ps, "out of memory");
    v->num = d;
    return v;
  }
  return fail(ps, "unexpected character");
}

jval* json_parse(const char* text, char* err, size_t errlen) {
  parser ps = {text, err, errlen, 0};
  if (err && errlen) err[0] = 0;
  jval* v = parse_value(&ps);
  if (!v) return NULL;
  skip_ws(&ps);
  if (*ps.p) {
    json_free(v);
    return fail(&ps, "trailing characters");
  }
  return v;
}

void json_free(jval* v) {
  if (!v) return;
  for (size_t i = 0; i < v->n; i++) {
    json_free(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  free(v);
}

const jval* json_get(const jval* obj, const char* key) {
  if (!obj || obj->type != J_OBJ) return NULL;
  for (size_t i = obj->n; i-- > 0;) /* last duplicate wins, like Python's json */
    if (!strcmp(obj->keys[i], key)) return obj->items[i];
  return NULL;
}

const char* json_str(const jval* v) { return v && v->type == J_STR ? v->str : NULL; }

int json_num(const jval* v, double* out) {
  if (v && v->type == J_NUM) { *out = v->num; return 0; }
  if (v && v->type == J_BOOL) { *out = v->b; return 0; }
  return -1;
}

/* ---- writer ---- */

void sb_init(sbuf* s) { memset(s, 0, sizeof *s); }
void sb_free(sbuf* s) { free(s->p); memset(s, 0, sizeof *s); }

static int sb_reserve(sbuf* s, size_t extra) {
  if (s->oom) return -1;
  if (s->len + extra + 1 <= s->cap) return 0;
  size_t cap = s->cap ? s->cap : 256;
  while (cap < s->len + extra + 1) cap *= 2;
  char* np = (char*)realloc(s->p, cap);
  if (!np) { s->oom = 1; return -1; }
  s->p = np;
  s->cap = cap;
  return 0;
}

void sb_raw(sbuf* s, const char* t) {
  size_t n = strlen(t);
  if (sb_reserve(s, n)) return;
  memcpy(s->p + s->len, t, n + 1);
  s->len += n;
}

void sb_printf(sbuf* s, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || sb_reserve(s, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(s->p + s->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  s->len += (size_t)n;
}

void sb_str(sbuf* s, const char* t) {
  if (!t) { sb_raw(s, "null"); return; }
  sb_raw(s, "\"");
  for (const unsigned char* q = (const unsigned char*)t; *q; q++) {
    char tmp[8];
    switch (*q) {
      case '"': sb_raw(s, "\\\""); break;
      case '\\': sb_raw(s, "\\\\"); break;
      case '\n': sb_raw(s, "\\n"); break;
      case '\r': sb_raw(s, "\\r"); break;
      case '\t': sb_raw(s, "\\t"); break;
      default:
        if (*q < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", *q); sb_raw(s, tmp); }
        else if (*q < 0x80) { tmp[0] = (char)*q; tmp[1] = 0; sb_raw(s, tmp); }
        else { /* pass valid UTF-8 through; replace stray bytes so the reply stays valid JSON */
          int len = (*q & 0xE0) == 0xC0 ? 2 : (*q & 0xF0) == 0xE0 ? 3 : (*q & 0xF8) == 0xF0 ? 4 : 0;
          int ok = len > 0;
          for (int i = 1; ok && i < len; i++) ok = (q[i] & 0xC0) == 0x80;
          if (!ok) { sb_raw(s, "\\ufffd"); break; }
          memcpy(tmp, q, (size_t)len);
          tmp[len] = 0;
          sb_raw(s, tmp);
          q += len - 1;
        }
    }
  }
  sb_raw(s, "\"");
}

void sb_double(sbuf* s, double v) {
  if (!isfinite(v)) { sb_raw(s, "null"); return; }
  sb_printf(s, "%.17g", v);
}
