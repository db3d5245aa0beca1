/* Internals shared by the chat-template builtins: the argument-binding macros, a text
 * builder, value helpers, the string helpers that filters and tests borrow from the string
 * methods, and the tables each file contributes.
 *
 *   jinja_filters.c the shared helpers, Jinja2's string and sequence filters and the
 *                   lookups of every table
 *   jinja_num.c     the number filters (abs, int, float, round, sum)
 *   jinja_json.c    the tojson filter
 *   jinja_str.c     Python's string methods
 *   jinja_seq.c     Python's dict and list methods and the loop object's
 *   jinja_tests.c   Jinja2's tests and the globals transformers provides
 *   jinja_markup.c  markupsafe's escaping, and which filters and methods keep a Markup
 *
 * Nothing here is part of text/jinja.h. */
#ifndef RIVER_TEXT_JINJA_BUILTINS_H
#define RIVER_TEXT_JINJA_BUILTINS_H

#include <stddef.h>
#include <stdint.h>

#include "text/jinja.h"

/* Binds the call's arguments to the named parameters in a[] (JV_ABSENT when not given). */

#define BIND(what, ...)                                                                            \
    static const char *const params_[] = {__VA_ARGS__, NULL};                                      \
    jval_t a[sizeof params_ / sizeof params_[0]];                                                  \
    do {                                                                                           \
        int berr_ = jr_bind(r, at, what, args, params_, a);                                        \
        if (berr_)                                                                                 \
            return berr_;                                                                          \
    } while (0)

#define NO_ARGS(what)                                                                              \
    do {                                                                                           \
        if (args->npos || args->nkw)                                                               \
            return jr_fail(r, at, RIVER_EINVAL, "%s takes no arguments", what);                    \
    } while (0)

#define GIVEN(v) ((v).t != JV_ABSENT)

/* A growable text; a failed allocation is remembered and reported by jinja__tb_done. */
typedef struct tb {
    jrender_t *r;
    const jnode_t *at;
    char *p;
    size_t n, cap;
    int err;
} tb_t;

void jinja__tb_put(tb_t *b, const char *s, size_t n);
void jinja__tb_cp(tb_t *b, int32_t cp);
int jinja__tb_done(tb_t *b, jval_t *out);
jval_t jinja__list_val(jlist_t *l);
jval_t jinja__dict_val(jdict_t *d);
int jinja__text_of(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out);
int jinja__want_str(jrender_t *r, const jnode_t *at, jval_t v, const char *what, jstr_t **out);
int jinja__want_int(jrender_t *r, const jnode_t *at, jval_t v, const char *what, int64_t *out);
/* The value at a dotted attribute path ("a.b", "0.name"), walked item by item as Jinja2's
 * make_attrgetter does for the attribute= arguments of filters. */
int jinja__get_path(jrender_t *r, const jnode_t *at, jval_t v, const jstr_t *path, jval_t *out);

/* ---- jinja_str.c ---- */

typedef int32_t (*cpmap_t)(int32_t);
int32_t jinja__cp_upper(int32_t c);
int32_t jinja__cp_lower(int32_t c);
int jinja__cp_alnum(int32_t c);
int jinja__map_str(jrender_t *r, const jnode_t *at, const jstr_t *s, cpmap_t f, jval_t *out);
int jinja__py_capitalize(jrender_t *r, const jnode_t *at, const jstr_t *s, jval_t *out);
int jinja__py_strip(jrender_t *r, const jnode_t *at, const jstr_t *s, const jstr_t *chars,
                    int which, jval_t *out);
int jinja__py_splitlines(jrender_t *r, const jnode_t *at, const char *s, size_t n, jlist_t **out);
int jinja__py_replace(jrender_t *r, const jnode_t *at, const jstr_t *s, const jstr_t *old,
                      const jstr_t *new_, int64_t count, jval_t *out);
int jinja__str_class(const jstr_t *s, int cls);
extern const jbuiltin_t jinja__str_methods[];
extern const size_t jinja__n_str_methods;

/* ---- jinja_seq.c ---- */

int jinja__m_items(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out);
extern const jbuiltin_t jinja__seq_methods[];
extern const size_t jinja__n_seq_methods;

/* ---- jinja_num.c, jinja_json.c ---- */

extern const jbuiltin_t jinja__num_filters[];
extern const size_t jinja__n_num_filters;
extern const jbuiltin_t jinja__json_filters[];
extern const size_t jinja__n_json_filters;

/* ---- jinja_tests.c ---- */

extern const jbuiltin_t jinja__tests[];
extern const size_t jinja__n_tests;
extern const jbuiltin_t jinja__globals[];
extern const size_t jinja__n_globals;

#endif
