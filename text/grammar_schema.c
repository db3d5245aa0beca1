/* JSON Schema → GBNF text (the subset text/grammar.h lists), grammar_from_json_schema and
 * grammar_json_object.
 *
 * Every sub-schema becomes a rule of its own, named "<prefix>-<n>", so the text never nests
 * parentheses deeper than one schema level needs, and a grammar error about a rule maps back
 * to the JSON pointer of the sub-schema it came from. JSON strings are written with their
 * character alternatives inline in the repetition (not as a rule of one character), which
 * keeps a whole run of string characters inside one rule for the matcher's classification.
 *
 * Recursion over the schema is bounded by GRAMMAR_MAX_NESTING, $ref chains included. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"

/* Whitespace between JSON tokens: nothing, one space, or a newline and up to 16 spaces or
 * tabs of indentation. */
#define WS "( \" \" | \"\\n\" [ \\t]{0,16} )?"
/* One JSON string character as it appears between the quotes. In the loop of an unbounded
 * string the escapes are alternatives of their own, so a run of characters never leaves the
 * loop's rule; in a length-bounded string (a chain of rules, one per character) the escape
 * after the backslash is one shared group instead, so that its positions are classified once
 * rather than once per place in the chain. */
#define HEX "[0-9a-fA-F]"
#define JCHAR                                                                              \
    "( [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt] | \"\\\\u\" " HEX " " HEX " " HEX " " HEX " )"
#define JCHAR_GROUPED                                                                      \
    "( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" " HEX "{4} ) )"
#define DIGITS_INT "( \"0\" | [1-9] [0-9]{0,15} )"
#define FRACTION "( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?"

#define NOMEM() river_err_set(RIVER_ENOMEM, "json schema: no memory")

enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_OBJ = 4,
    T_ARR = 8,
    T_STR = 16,
    T_NUM = 32,
    T_INT = 64,
    T_ANY = 127
};

enum { NEED_VALUE = 1, NEED_STRING = 2, NEED_NUMBER = 4, NEED_INTEGER = 8, NEED_UNUMBER = 16,
       NEED_UINTEGER = 32 };

typedef struct sc {
    json_t *doc;
    const char *prefix;
    grammar__buf_t rules;
    uint32_t serial;
    char **paths; /* [serial] JSON pointer of rule <prefix>-<i> */
    uint32_t cap_paths;
    char **ref_keys; /* $ref memo: ref string → rule serial */
    uint32_t *ref_rule, n_refs, cap_refs;
    /* Shared rules of strings with a length bound or a pattern, so that equal constraints
     * give the matcher the same positions to classify once: (min, max) pairs (max
     * GRAMMAR__INF: none) and pattern texts. */
    uint32_t (*lens)[2], n_lens, cap_lens;
    char **pats;
    uint32_t n_pats, cap_pats;
    int need;
    int depth;
} sc_t;

static const char *const annotations[] = {
    "title",   "description", "default", "examples",   "$schema",   "$id",  "$comment",
    "format",  "strict",      "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
    "minimum", "maximum",     "exclusiveMinimum", "exclusiveMaximum", "multipleOf", NULL};

static const char *const keywords[] = {
    "type",  "enum",     "const",    "anyOf",      "oneOf",      "allOf",     "$ref",
    "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", NULL};

static int in_list(const char *const *list, const char *k)
{
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], k) == 0)
            return 1;
    return 0;
}

/* path + "/" + key, the key escaped as a JSON pointer token. malloc'd. */
static char *path_join(const char *path, const char *key)
{
    grammar__buf_t b = {0};
    grammar__buf_puts(&b, path);
    grammar__buf_puts(&b, "/");
    for (const char *k = key; *k; k++) {
        if (*k == '~')
            grammar__buf_puts(&b, "~0");
        else if (*k == '/')
            grammar__buf_puts(&b, "~1");
        else
            grammar__buf_put(&b, k, 1);
    }
    if (b.oom) {
        grammar__buf_free(&b);
        return NULL;
    }
    return b.p;
}

static char *path_index(const char *path, size_t i)
{
    char num[32];
    snprintf(num, sizeof num, "%zu", i);
    return path_join(path, num);
}

/* Where an error points: the path, or "/" for the root. */
static const char *at(const char *path)
{
    return *path ? path : "/";
}

/* A new rule serial for the sub-schema at path. */
static int rule_new(sc_t *c, const char *path, uint32_t *serial)
{
    if (c->serial >= GRAMMAR_MAX_RULES)
        return river_err_set(RIVER_ERANGE, "%s: schema needs more than %u rules", at(path),
                             (unsigned)GRAMMAR_MAX_RULES);
    if (c->serial == c->cap_paths) {
        uint32_t cap = c->cap_paths ? c->cap_paths * 2 : 32;
        char **p = realloc(c->paths, cap * sizeof *p);
        if (!p)
            return NOMEM();
        c->paths = p;
        c->cap_paths = cap;
    }
    c->paths[c->serial] = strdup(path);
    if (!c->paths[c->serial])
        return NOMEM();
    *serial = c->serial++;
    return 0;
}

static void put_rule_name(sc_t *c, grammar__buf_t *b, uint32_t serial)
{
    grammar__buf_printf(b, "%s-%u", c->prefix, (unsigned)serial);
}

/* Writes "<prefix>-<serial> ::= <expr>\n" to the rules. */
static int rule_emit(sc_t *c, uint32_t serial, const grammar__buf_t *expr)
{
    put_rule_name(c, &c->rules, serial);
    grammar__buf_puts(&c->rules, " ::= ");
    grammar__buf_put(&c->rules, expr->p ? expr->p : "\"\"", expr->p ? expr->len : 2);
    grammar__buf_puts(&c->rules, "\n");
    return c->rules.oom || expr->oom ? NOMEM() : 0;
}

/* The compact JSON text of v as a GBNF literal. */
static int put_json_literal(grammar__buf_t *b, const json_t *v, const char *path)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s)
        return river_err_set(RIVER_EINVAL, "%s: value cannot be written as JSON", at(path));
    grammar__buf_literal(b, s, strlen(s));
    free(s);
    return 0;
}

static int get_count(const json_t *s, const char *key, const char *path, uint32_t *out,
                     int *present)
{
    const json_t *v = json_object_get(s, key);
    *present = v != NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return river_err_set(RIVER_EFORMAT, "%s/%s: must be a non-negative integer", path, key);
    if (json_integer_value(v) > GRAMMAR_MAX_REPEAT)
        return river_err_set(RIVER_ERANGE, "%s/%s: %lld is over the limit of %u", path, key,
                             (long long)json_integer_value(v), (unsigned)GRAMMAR_MAX_REPEAT);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static void put_repeat(grammar__buf_t *b, uint32_t min, uint32_t max, int bounded)
{
    if (!bounded)
        grammar__buf_printf(b, "{%u,}", (unsigned)min);
    else
        grammar__buf_printf(b, "{%u,%u}", (unsigned)min, (unsigned)max);
}

static int compile(sc_t *c, json_t *s, const char *path, uint32_t *serial);

/* A sub-schema's rule name into b. */
static int put_sub(sc_t *c, grammar__buf_t *b, json_t *s, const char *path)
{
    uint32_t serial;
    int err = compile(c, s, path, &serial);
    if (!err)
        put_rule_name(c, b, serial);
    return err;
}

static int put_string(sc_t *c, grammar__buf_t *b, json_t *s, const char *path)
{
    uint32_t min = 0, max = 0;
    int has_min, has_max, err;
    if ((err = get_count(s, "minLength", path, &min, &has_min)) ||
        (err = get_count(s, "maxLength", path, &max, &has_max)))
        return err;
    const json_t *pat = json_object_get(s, "pattern");
    if (pat) {
        if (!json_is_string(pat))
            return river_err_set(RIVER_EFORMAT, "%s/pattern: must be a string", path);
        if (has_min || has_max)
            return river_err_set(RIVER_EUNSUPPORTED, "%s/pattern: pattern together with "
                                                     "minLength/maxLength is not supported",
                                 path);
        const char *re = json_string_value(pat);
        for (uint32_t i = 0; i < c->n_pats; i++)
            if (strcmp(c->pats[i], re) == 0) {
                grammar__buf_printf(b, "%s-p%u", c->prefix, (unsigned)i);
                return 0;
            }
        if ((err = grammar__room((void **)&c->pats, c->n_pats + 1, &c->cap_pats,
                                 sizeof *c->pats, 8)))
            return err;
        char *pp = path_join(path, "pattern");
        if (!pp || !(c->pats[c->n_pats] = strdup(re))) {
            free(pp);
            return NOMEM();
        }
        uint32_t k = c->n_pats++;
        grammar__buf_t e = {0};
        grammar__buf_printf(&e, "%s-p%u ::= \"\\\"\" ", c->prefix, (unsigned)k);
        err = grammar__regex_to_gbnf(re, json_string_length(pat), pp, JCHAR, &e);
        free(pp);
        grammar__buf_puts(&e, " \"\\\"\"\n");
        if (!err && e.oom)
            err = NOMEM();
        if (!err) {
            grammar__buf_put(&c->rules, e.p, e.len);
            grammar__buf_printf(b, "%s-p%u", c->prefix, (unsigned)k);
        }
        grammar__buf_free(&e);
        return err;
    }
    if (!has_min && !has_max) {
        c->need |= NEED_STRING;
        grammar__buf_printf(b, "%s-string", c->prefix);
        return 0;
    }
    if (has_max && max < min)
        return river_err_set(RIVER_EFORMAT, "%s/maxLength: %u is less than minLength %u", path,
                             (unsigned)max, (unsigned)min);
    uint32_t hi = has_max ? max : GRAMMAR__INF;
    for (uint32_t i = 0; i < c->n_lens; i++)
        if (c->lens[i][0] == min && c->lens[i][1] == hi) {
            grammar__buf_printf(b, "%s-s%u", c->prefix, (unsigned)i);
            return 0;
        }
    if ((err = grammar__room((void **)&c->lens, c->n_lens + 1, &c->cap_lens, sizeof *c->lens, 8)))
        return err;
    uint32_t k = c->n_lens++;
    c->lens[k][0] = min;
    c->lens[k][1] = hi;
    grammar__buf_printf(&c->rules, "%s-s%u ::= \"\\\"\" " JCHAR_GROUPED, c->prefix, (unsigned)k);
    put_repeat(&c->rules, min, max, has_max);
    grammar__buf_puts(&c->rules, " \"\\\"\"\n");
    grammar__buf_printf(b, "%s-s%u", c->prefix, (unsigned)k);
    return c->rules.oom ? NOMEM() : 0;
}

static int nonnegative_bound(const json_t *s)
{
    const json_t *m = json_object_get(s, "minimum");
    const json_t *x = json_object_get(s, "exclusiveMinimum");
    return (m && json_is_number(m) && json_number_value(m) >= 0) ||
           (x && json_is_number(x) && json_number_value(x) >= 0);
}

static int put_object(sc_t *c, grammar__buf_t *b, json_t *s, const char *path)
{
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    int err = 0;
    if (props && !json_is_object(props))
        return river_err_set(RIVER_EFORMAT, "%s/properties: must be an object", path);
    if (req && !json_is_array(req))
        return river_err_set(RIVER_EFORMAT, "%s/required: must be an array", path);
    size_t n = props ? json_object_size(props) : 0;
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r))
            return river_err_set(RIVER_EFORMAT, "%s/required/%zu: must be a string", path, i);
        if (!props || !json_object_get(props, json_string_value(r)))
            return river_err_set(RIVER_EFORMAT, "%s/required/%zu: \"%s\" is not in properties",
                                 path, i, json_string_value(r));
    }
    /* Extra members: a rule for their values, or none. */
    grammar__buf_t extra = {0};
    if (addl && !json_is_false(addl)) {
        char *ap = path_join(path, "additionalProperties");
        if (!ap)
            return NOMEM();
        c->need |= NEED_STRING;
        grammar__buf_printf(&extra, "%s-string \":\" " WS " ", c->prefix);
        err = put_sub(c, &extra, addl, ap);
        grammar__buf_puts(&extra, " " WS);
        free(ap);
        if (err)
            goto end;
    }
    if (n == 0 && !extra.len) {
        grammar__buf_puts(b, "\"{\" " WS " \"}\"");
        goto end;
    }
    /* Members in schema order: S_i (none written yet) and R_i (some written) for the members
     * from i on; the others may be absent. */
    const char **names = calloc(n + 1, sizeof *names);
    uint32_t *vals = calloc(n + 1, sizeof *vals);
    uint8_t *required = calloc(n + 1, 1);
    uint32_t first = 0;
    if (!names || !vals || !required) {
        err = NOMEM();
        goto end_lists;
    }
    {
        size_t i = 0;
        const char *key;
        json_t *val;
        json_object_foreach(props, key, val)
        {
            char *pp = path_join(path, "properties");
            char *kp = pp ? path_join(pp, key) : NULL;
            free(pp);
            if (!kp) {
                err = NOMEM();
                goto end_lists;
            }
            names[i] = key;
            err = compile(c, val, kp, &vals[i]);
            free(kp);
            if (err)
                goto end_lists;
            for (size_t k = 0; req && k < json_array_size(req); k++)
                if (strcmp(json_string_value(json_array_get(req, k)), key) == 0)
                    required[i] = 1;
            i++;
        }
    }
    /* Rules S_0..S_n then R_0..R_n, numbered from first. */
    for (size_t i = 0; i < 2 * (n + 1); i++) {
        uint32_t sr;
        if ((err = rule_new(c, path, &sr)))
            goto end_lists;
        if (i == 0)
            first = sr;
    }
    for (size_t i = 0; i <= n; i++) {
        for (int r = 0; r < 2; r++) {
            grammar__buf_t e = {0};
            uint32_t me = first + (uint32_t)(r * (n + 1) + i);
            if (i == n) {
                if (!extra.len)
                    grammar__buf_puts(&e, "\"\"");
                else if (r == 0)
                    grammar__buf_printf(&e, "( %s ( \",\" " WS " %s )* )?", extra.p, extra.p);
                else
                    grammar__buf_printf(&e, "( \",\" " WS " %s )*", extra.p);
            } else {
                json_t *kj = json_string(names[i]);
                char *key_text = kj ? json_dumps(kj, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
                json_decref(kj);
                if (!key_text) {
                    grammar__buf_free(&e);
                    err = NOMEM();
                    goto end_lists;
                }
                if (r == 1)
                    grammar__buf_puts(&e, "\",\" " WS " ");
                grammar__buf_literal(&e, key_text, strlen(key_text));
                free(key_text);
                grammar__buf_puts(&e, " \":\" " WS " ");
                put_rule_name(c, &e, vals[i]);
                grammar__buf_puts(&e, " " WS " ");
                put_rule_name(c, &e, first + (uint32_t)(n + 1 + i + 1));
                if (!required[i]) {
                    grammar__buf_puts(&e, " | ");
                    put_rule_name(c, &e, first + (uint32_t)(r * (n + 1) + i + 1));
                }
            }
            err = rule_emit(c, me, &e);
            grammar__buf_free(&e);
            if (err)
                goto end_lists;
        }
    }
    grammar__buf_puts(b, "\"{\" " WS " ");
    put_rule_name(c, b, first);
    grammar__buf_puts(b, " \"}\"");
end_lists:
    free(names);
    free(vals);
    free(required);
end:
    grammar__buf_free(&extra);
    return err;
}

static int put_array(sc_t *c, grammar__buf_t *b, json_t *s, const char *path)
{
    uint32_t min = 0, max = 0;
    int has_min, has_max, err;
    if ((err = get_count(s, "minItems", path, &min, &has_min)) ||
        (err = get_count(s, "maxItems", path, &max, &has_max)))
        return err;
    if (has_max && max < min)
        return river_err_set(RIVER_EFORMAT, "%s/maxItems: %u is less than minItems %u", path,
                             (unsigned)max, (unsigned)min);
    json_t *items = json_object_get(s, "items");
    if (items && json_is_false(items))
        has_max = 1, max = 0;
    if (has_max && max == 0) {
        if (min > 0)
            return river_err_set(RIVER_EFORMAT, "%s: minItems %u with no items allowed", path,
                                 (unsigned)min);
        grammar__buf_puts(b, "\"[\" " WS " \"]\"");
        return 0;
    }
    grammar__buf_t item = {0};
    if (items && !json_is_true(items)) {
        char *ip = path_join(path, "items");
        if (!ip)
            return NOMEM();
        err = put_sub(c, &item, items, ip);
        free(ip);
        if (err) {
            grammar__buf_free(&item);
            return err;
        }
    } else {
        c->need |= NEED_VALUE;
        grammar__buf_printf(&item, "%s-value", c->prefix);
    }
    uint32_t a = (min > 0 ? min : 1) - 1;
    grammar__buf_puts(b, "\"[\" " WS " ");
    if (min == 0)
        grammar__buf_puts(b, "( ");
    grammar__buf_printf(b, "%s " WS " ( \",\" " WS " %s " WS " )", item.p, item.p);
    if (!has_max && a == 0)
        grammar__buf_puts(b, "*");
    else
        put_repeat(b, a, has_max ? max - 1 : 0, has_max);
    if (min == 0)
        grammar__buf_puts(b, " )?");
    grammar__buf_puts(b, " \"]\"");
    grammar__buf_free(&item);
    return 0;
}

/* Resolves a local $ref ("#" or "#/a/b" JSON pointer) in the document. */
static json_t *resolve(sc_t *c, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    json_t *cur = c->doc;
    const char *p = ref + 1;
    if (*p == '\0')
        return cur;
    if (*p != '/')
        return NULL;
    char tok[1024];
    while (*p == '/' && cur) {
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1'))
                ch = *p++ == '0' ? '~' : '/';
            if (n + 1 >= sizeof tok)
                return NULL;
            tok[n++] = ch;
        }
        tok[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            cur = (*tok && !*end) ? json_array_get(cur, i) : NULL;
        } else {
            cur = NULL;
        }
    }
    return cur;
}

static int compile_ref(sc_t *c, json_t *s, const char *path, uint32_t *serial)
{
    json_t *ref = json_object_get(s, "$ref");
    if (!json_is_string(ref))
        return river_err_set(RIVER_EFORMAT, "%s/$ref: must be a string", path);
    const char *r = json_string_value(ref);
    for (uint32_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->ref_keys[i], r) == 0) {
            *serial = c->ref_rule[i];
            return 0;
        }
    json_t *target = resolve(c, r);
    if (!target)
        return river_err_set(RIVER_EFORMAT, "%s/$ref: \"%s\" does not resolve in this schema "
                                            "(only local references such as \"#/$defs/NAME\")",
                             path, r);
    if (c->n_refs == c->cap_refs) {
        uint32_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        char **k = realloc(c->ref_keys, cap * sizeof *k);
        if (!k)
            return NOMEM();
        c->ref_keys = k;
        uint32_t *v = realloc(c->ref_rule, cap * sizeof *v);
        if (!v)
            return NOMEM();
        c->ref_rule = v;
        c->cap_refs = cap;
    }
    /* The rule's name is known before its body is compiled, so a recursive reference to it
     * finds it in the memo. */
    const char *target_path = r + 1;
    int err = rule_new(c, *target_path ? target_path : "", serial);
    if (err)
        return err;
    if (!(c->ref_keys[c->n_refs] = strdup(r)))
        return NOMEM();
    c->ref_rule[c->n_refs++] = *serial;
    uint32_t body;
    if ((err = compile(c, target, target_path, &body)))
        return err;
    grammar__buf_t e = {0};
    put_rule_name(c, &e, body);
    err = rule_emit(c, *serial, &e);
    grammar__buf_free(&e);
    return err;
}

static int type_bits(const json_t *t, const char *path, int *bits)
{
    static const struct {
        const char *name;
        int bit;
    } names[] = {{"null", T_NULL},   {"boolean", T_BOOL}, {"object", T_OBJ}, {"array", T_ARR},
                 {"string", T_STR},  {"number", T_NUM},   {"integer", T_INT}};
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    if (json_is_array(t) && n == 0)
        return river_err_set(RIVER_EFORMAT, "%s/type: empty list of types", path);
    *bits = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        if (!json_is_string(x))
            return river_err_set(RIVER_EFORMAT, "%s/type: must be a string or a list of strings",
                                 path);
        int found = 0;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strcmp(names[k].name, json_string_value(x)) == 0) {
                *bits |= names[k].bit;
                found = 1;
            }
        if (!found)
            return river_err_set(RIVER_EFORMAT, "%s/type: unknown type \"%s\"", path,
                                 json_string_value(x));
    }
    return 0;
}

static int compile_body(sc_t *c, json_t *s, const char *path, grammar__buf_t *e)
{
    int err;
    const char *key;
    json_t *val;
    json_object_foreach(s, key, val)
    {
        if (!in_list(keywords, key) && !in_list(annotations, key))
            return river_err_set(RIVER_EUNSUPPORTED, "%s/%s: unsupported keyword", path, key);
    }
    /* Combinators stand alone (annotations aside). */
    static const char *const combinators[] = {"$ref", "anyOf", "oneOf", "allOf", NULL};
    for (int i = 0; combinators[i]; i++) {
        if (!json_object_get(s, combinators[i]))
            continue;
        json_object_foreach(s, key, val)
        {
            if (strcmp(key, combinators[i]) != 0 && !in_list(annotations, key))
                return river_err_set(RIVER_EUNSUPPORTED,
                                     "%s/%s: combining %s with other keywords is not supported",
                                     path, key, combinators[i]);
        }
    }
    json_t *x;
    if (json_object_get(s, "$ref")) {
        uint32_t r;
        if ((err = compile_ref(c, s, path, &r)))
            return err;
        put_rule_name(c, e, r);
        return 0;
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf")) ||
        (x = json_object_get(s, "allOf"))) {
        const char *kw = json_object_get(s, "anyOf")   ? "anyOf"
                         : json_object_get(s, "oneOf") ? "oneOf"
                                                       : "allOf";
        if (!json_is_array(x) || json_array_size(x) == 0)
            return river_err_set(RIVER_EFORMAT, "%s/%s: must be a non-empty array", path, kw);
        if (strcmp(kw, "allOf") == 0 && json_array_size(x) != 1)
            return river_err_set(RIVER_EUNSUPPORTED, "%s/allOf: only one schema is supported",
                                 path);
        if (json_array_size(x) > GRAMMAR_MAX_ENUM)
            return river_err_set(RIVER_ERANGE, "%s/%s: more than %u alternatives", path, kw,
                                 (unsigned)GRAMMAR_MAX_ENUM);
        char *kp = path_join(path, kw);
        if (!kp)
            return NOMEM();
        grammar__buf_puts(e, "( ");
        for (size_t i = 0; i < json_array_size(x); i++) {
            char *ip = path_index(kp, i);
            if (!ip) {
                free(kp);
                return NOMEM();
            }
            if (i)
                grammar__buf_puts(e, " | ");
            err = put_sub(c, e, json_array_get(x, i), ip);
            free(ip);
            if (err) {
                free(kp);
                return err;
            }
        }
        free(kp);
        grammar__buf_puts(e, " )");
        return 0;
    }
    if ((x = json_object_get(s, "enum"))) {
        if (!json_is_array(x) || json_array_size(x) == 0)
            return river_err_set(RIVER_EFORMAT, "%s/enum: must be a non-empty array", path);
        if (json_array_size(x) > GRAMMAR_MAX_ENUM)
            return river_err_set(RIVER_ERANGE, "%s/enum: %zu values, over the limit of %u", path,
                                 json_array_size(x), (unsigned)GRAMMAR_MAX_ENUM);
        grammar__buf_puts(e, "( ");
        for (size_t i = 0; i < json_array_size(x); i++) {
            if (i)
                grammar__buf_puts(e, " | ");
            char *ip = path_index(path, i);
            err = ip ? put_json_literal(e, json_array_get(x, i), ip) : NOMEM();
            free(ip);
            if (err)
                return err;
        }
        grammar__buf_puts(e, " )");
        return 0;
    }
    if ((x = json_object_get(s, "const")))
        return put_json_literal(e, x, path);
    int bits = 0;
    json_t *t = json_object_get(s, "type");
    if (t) {
        if ((err = type_bits(t, path, &bits)))
            return err;
    } else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
               json_object_get(s, "additionalProperties")) {
        bits = T_OBJ;
    } else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
               json_object_get(s, "maxItems")) {
        bits = T_ARR;
    } else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
               json_object_get(s, "pattern")) {
        bits = T_STR;
    } else {
        c->need |= NEED_VALUE;
        grammar__buf_printf(e, "%s-value", c->prefix);
        return 0;
    }
    if (bits & T_NUM)
        bits &= ~T_INT; /* every integer is a number */
    int n = 0;
    grammar__buf_puts(e, "( ");
    for (int bit = 1; bit < T_ANY; bit <<= 1) {
        if (!(bits & bit))
            continue;
        if (n++)
            grammar__buf_puts(e, " | ");
        err = 0;
        switch (bit) {
        case T_NULL:
            grammar__buf_puts(e, "\"null\"");
            break;
        case T_BOOL:
            grammar__buf_puts(e, "\"true\" | \"false\"");
            break;
        case T_OBJ:
            err = put_object(c, e, s, path);
            break;
        case T_ARR:
            err = put_array(c, e, s, path);
            break;
        case T_STR:
            err = put_string(c, e, s, path);
            break;
        case T_NUM:
        case T_INT: {
            int u = nonnegative_bound(s);
            int need = bit == T_NUM ? (u ? NEED_UNUMBER : NEED_NUMBER)
                                    : (u ? NEED_UINTEGER : NEED_INTEGER);
            c->need |= need;
            grammar__buf_printf(e, "%s-%s%s", c->prefix, u ? "u" : "",
                                bit == T_NUM ? "number" : "integer");
            break;
        }
        }
        if (err)
            return err;
    }
    grammar__buf_puts(e, " )");
    return 0;
}

static int compile(sc_t *c, json_t *s, const char *path, uint32_t *serial)
{
    if (c->depth >= GRAMMAR_MAX_NESTING)
        return river_err_set(RIVER_ERANGE, "%s: schema nested deeper than %d levels", at(path),
                             GRAMMAR_MAX_NESTING);
    int err;
    if (json_is_false(s))
        return river_err_set(RIVER_EFORMAT, "%s: the schema false matches nothing", at(path));
    if (!json_is_true(s) && !json_is_object(s))
        return river_err_set(RIVER_EFORMAT, "%s: a schema must be an object or a boolean",
                             at(path));
    if ((err = rule_new(c, path, serial)))
        return err;
    grammar__buf_t e = {0};
    if (json_is_true(s)) {
        c->need |= NEED_VALUE;
        grammar__buf_printf(&e, "%s-value", c->prefix);
    } else {
        c->depth++;
        err = compile_body(c, s, path, &e);
        c->depth--;
    }
    if (!err)
        err = rule_emit(c, *serial, &e);
    grammar__buf_free(&e);
    return err;
}

static void emit_shared(sc_t *c)
{
    grammar__buf_t *b = &c->rules;
    const char *p = c->prefix;
    if (c->need & NEED_VALUE)
        c->need |= NEED_STRING | NEED_NUMBER;
    if (c->need & NEED_VALUE) {
        grammar__buf_printf(b,
                            "%s-value ::= %s-object | %s-array | %s-string | %s-number | "
                            "\"true\" | \"false\" | \"null\"\n",
                            p, p, p, p, p);
        grammar__buf_printf(b,
                            "%s-object ::= \"{\" " WS " ( %s-string \":\" " WS " %s-value " WS
                            " ( \",\" " WS " %s-string \":\" " WS " %s-value " WS " )* )? "
                            "\"}\"\n",
                            p, p, p, p, p);
        grammar__buf_printf(b,
                            "%s-array ::= \"[\" " WS " ( %s-value " WS " ( \",\" " WS
                            " %s-value " WS " )* )? \"]\"\n",
                            p, p, p);
    }
    if (c->need & NEED_STRING)
        grammar__buf_printf(b, "%s-string ::= \"\\\"\" " JCHAR "* \"\\\"\"\n", p);
    if (c->need & NEED_NUMBER)
        grammar__buf_printf(b, "%s-number ::= \"-\"? " DIGITS_INT " " FRACTION "\n", p);
    if (c->need & NEED_UNUMBER)
        grammar__buf_printf(b, "%s-unumber ::= " DIGITS_INT " " FRACTION "\n", p);
    if (c->need & NEED_INTEGER)
        grammar__buf_printf(b, "%s-integer ::= \"-\"? " DIGITS_INT "\n", p);
    if (c->need & NEED_UINTEGER)
        grammar__buf_printf(b, "%s-uinteger ::= " DIGITS_INT "\n", p);
}

static void sc_free(sc_t *c)
{
    grammar__buf_free(&c->rules);
    for (uint32_t i = 0; i < c->serial; i++)
        free(c->paths[i]);
    free(c->paths);
    for (uint32_t i = 0; i < c->n_refs; i++)
        free(c->ref_keys[i]);
    free(c->ref_keys);
    free(c->ref_rule);
    free(c->lens);
    for (uint32_t i = 0; i < c->n_pats; i++)
        free(c->pats[i]);
    free(c->pats);
    json_decref(c->doc);
}

/* Schema text → GBNF rules in c->rules, the schema's value being rule `prefix`. */
static int to_gbnf(sc_t *c, const char *schema, size_t len, const char *prefix)
{
    size_t plen = prefix ? strlen(prefix) : 0;
    if (plen == 0 || plen > 64)
        return river_err_set(RIVER_EINVAL, "json schema: rule prefix must be 1 to 64 characters");
    for (size_t i = 0; i < plen; i++) {
        char ch = prefix[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_'))
            return river_err_set(RIVER_EINVAL, "json schema: rule prefix \"%s\" must be "
                                               "[A-Za-z0-9_]+",
                                 prefix);
    }
    if (!schema && len)
        return river_err_set(RIVER_EINVAL, "json schema: no text");
    if (len > GRAMMAR_MAX_TEXT)
        return river_err_set(RIVER_ERANGE, "json schema: %zu bytes, over the limit of %u", len,
                             (unsigned)GRAMMAR_MAX_TEXT);
    json_error_t je;
    c->doc = json_loadb(schema ? schema : "", len, JSON_DECODE_ANY, &je);
    if (!c->doc)
        return river_err_set(RIVER_EFORMAT, "json schema: not valid JSON: %s (line %d, column %d)",
                             je.text, je.line, je.column);
    c->prefix = prefix;
    uint32_t top;
    int err = compile(c, c->doc, "", &top);
    if (err)
        return err;
    grammar__buf_printf(&c->rules, "%s ::= %s-%u\n", prefix, prefix, (unsigned)top);
    emit_shared(c);
    return c->rules.oom ? NOMEM() : 0;
}

int grammar_json_schema_to_gbnf(const char *schema_json, size_t len, const char *rule_prefix,
                                char **gbnf_out)
{
    if (!gbnf_out)
        return river_err_set(RIVER_EINVAL, "grammar_json_schema_to_gbnf: no output pointer");
    *gbnf_out = NULL;
    sc_t c = {0};
    int err = to_gbnf(&c, schema_json, len, rule_prefix);
    if (!err) {
        *gbnf_out = c.rules.p;
        c.rules.p = NULL;
    }
    sc_free(&c);
    return err;
}

int grammar_from_json_schema(grammar_t **out, const char *schema_json, size_t len)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "grammar_from_json_schema: no output pointer");
    *out = NULL;
    sc_t c = {0};
    int err = to_gbnf(&c, schema_json, len, "root");
    if (!err) {
        char *bad = NULL;
        err = grammar__parse_ex(out, c.rules.p, c.rules.len, &bad);
        /* A rule that never finishes or recurses on itself came from a $ref cycle: name the
         * schema part, not the generated rule. */
        unsigned serial;
        if (err && bad && sscanf(bad, "root-%u", &serial) == 1 && serial < c.serial) {
            int left = strstr(river_err_detail(), "left-recursive") != NULL;
            err = river_err_set(err, "%s: %s", at(c.paths[serial]),
                                left ? "recursive $ref that recurses before matching anything"
                                     : "recursive $ref with no way out (every alternative "
                                       "recurses before it can end)");
        }
        free(bad);
    }
    sc_free(&c);
    return err;
}

int grammar_json_object(grammar_t **out)
{
    static const char schema[] = "{\"type\": \"object\", \"additionalProperties\": true}";
    return grammar_from_json_schema(out, schema, sizeof schema - 1);
}
