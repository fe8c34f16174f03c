/* Minimal JSON: a tree parser for request.json and a string builder for the replies. */
#ifndef EDGETUNE_JSON_H_
#define EDGETUNE_JSON_H_

#include <stddef.h>
#include <stdint.h>

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
  jtype type;
  int b;
  double num;
  char* str;          /* J_STR: decoded UTF-8, NUL-terminated */
  struct jval** items; /* J_ARR / J_OBJ values */
  char** keys;        /* J_OBJ keys */
  size_t n;
} jval;

/* Parse a whole document. NULL on error with a message in err. */
jval* json_parse(const char* text, char* err, size_t errlen);
void json_free(jval* v);
const jval* json_get(const jval* obj, const char* key); /* NULL if absent or not an object */
const char* json_str(const jval* v);                    /* NULL unless J_STR */
int json_num(const jval* v, double* out);               /* 0 if J_NUM (or J_BOOL) */

typedef struct {
  char* p;
  size_t len, cap;
  int oom;
} sbuf;

void sb_init(sbuf* s);
void sb_free(sbuf* s);
void sb_raw(sbuf* s, const char* t);
void sb_printf(sbuf* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_str(sbuf* s, const char* t); /* JSON string literal, or null when t == NULL */
void sb_double(sbuf* s, double v);   /* finite numbers only; NaN/inf become null */

#endif
