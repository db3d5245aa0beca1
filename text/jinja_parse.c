/* The chat-template parser: tokens to an AST (text/jinja.h), by recursive descent with
 * Jinja2's grammar and operator precedence (jinja2/parser.py): conditional expression, or,
 * and, not, comparisons and "in", + -, ~, * / // %, **, unary - +, then postfix (.name,
 * [index], [slice], calls) and filters / tests, which bind tighter than every binary
 * operator. Filters and tests are resolved here, so an unknown one fails the compilation.
 * Nesting is bounded (JINJA_MAX_NEST) so that no input can exhaust the stack. */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "text/jinja.h"

typedef struct parser {
    jarena_t *a;
    const char *name;
    const jtok_t *t;
    size_t n, pos;
    int nest;       /* current recursion depth */
    int loop_depth; /* enclosing for loops (break/continue allowed) */
} parser_t;

static int p_fail(parser_t *P, int line, const char *fmt, const char *arg)
{
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    return river_err_set(RIVER_EFORMAT, "%s:%d: %s", P->name, line, msg);
}

static int p_oom(parser_t *P)
{
    return river_err_set(jarena_over_cap(P->a) ? RIVER_EFULL : RIVER_ENOMEM,
                         "%s: template too large to compile", P->name);
}

static const jtok_t *cur(const parser_t *P)
{
    return &P->t[P->pos < P->n ? P->pos : P->n - 1];
}

static const jtok_t *peek(const parser_t *P, size_t k)
{
    size_t i = P->pos + k;
    return &P->t[i < P->n ? i : P->n - 1];
}

static void next(parser_t *P)
{
    if (P->pos < P->n - 1)
        P->pos++;
}

static int is_op(const jtok_t *t, int op)
{
    return t->type == TK_OP && t->op == op;
}

static int is_name(const jtok_t *t, const char *nm)
{
    return t->type == TK_NAME && !strcmp(t->s, nm);
}

static const char *tok_desc(const jtok_t *t)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_NAME: return "a name";
    case TK_STRING: return "a string";
    case TK_INT: return "an integer";
    case TK_FLOAT: return "a float";
    case TK_OP: return "an operator";
    }
    return "a token";
}

static int expect_op(parser_t *P, int op, const char *what)
{
    if (!is_op(cur(P), op))
        return p_fail(P, cur(P)->line, "expected %s", what);
    next(P);
    return 0;
}

static int expect_block_end(parser_t *P)
{
    if (cur(P)->type != TK_BLOCK_END)
        return p_fail(P, cur(P)->line, "expected '%%}', found %s", tok_desc(cur(P)));
    next(P);
    return 0;
}

static jnode_t *node_new(parser_t *P, jnode_kind_t kind, int line)
{
    jnode_t *nd = jarena_alloc(P->a, sizeof *nd);
    if (nd) {
        nd->kind = kind;
        nd->line = line;
    }
    return nd;
}

/* A growable array of node pointers in the arena. */
typedef struct nvec {
    jnode_t **v;
    size_t n, cap;
} nvec_t;

static int nvec_push(parser_t *P, nvec_t *v, jnode_t *nd)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode_t **nv = jarena_alloc(P->a, cap * sizeof *nv);
        if (!nv)
            return p_oom(P);
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = nd;
    return 0;
}

static int enter(parser_t *P)
{
    if (++P->nest > JINJA_MAX_NEST)
        return p_fail(P, cur(P)->line, "template nested too deeply (more than %s levels)",
                      "256");
    return 0;
}

static int parse_expr(parser_t *P, jnode_t **out);
static int parse_or(parser_t *P, jnode_t **out);
static int parse_unary(parser_t *P, int with_filter, jnode_t **out);

/* "(" args ")" after a callee, a filter or a test: positional, then name=value. */
static int parse_call_args(parser_t *P, jnode_t *nd)
{
    nvec_t pos = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t kwcap = 0;
    int err = expect_op(P, '(', "'('");
    if (err)
        return err;
    while (!is_op(cur(P), ')')) {
        if (pos.n + kwv.n) {
            if ((err = expect_op(P, ',', "',' or ')' in an argument list")))
                return err;
            if (is_op(cur(P), ')'))
                break;
        }
        if (is_op(cur(P), '*') || is_op(cur(P), OP_POW))
            return p_fail(P, cur(P)->line, "*args and **kwargs in calls are not supported%s", "");
        if (cur(P)->type == TK_NAME && is_op(peek(P, 1), '=')) {
            const char *kn = cur(P)->s;
            next(P);
            next(P);
            jnode_t *v;
            if ((err = parse_expr(P, &v)))
                return err;
            if (kwv.n == kwcap) {
                size_t cap = kwcap ? kwcap * 2 : 4;
                const char **nk = jarena_alloc(P->a, cap * sizeof *nk);
                if (!nk)
                    return p_oom(P);
                if (kwv.n)
                    memcpy(nk, kwn, kwv.n * sizeof *nk);
                kwn = nk;
                kwcap = cap;
            }
            kwn[kwv.n] = kn;
            if ((err = nvec_push(P, &kwv, v)))
                return err;
        } else {
            if (kwv.n)
                return p_fail(P, cur(P)->line, "positional argument after keyword arguments%s", "");
            jnode_t *v;
            if ((err = parse_expr(P, &v)) || (err = nvec_push(P, &pos, v)))
                return err;
        }
    }
    next(P);
    nd->list = pos.v;
    nd->n = pos.n;
    nd->kwnames = kwn;
    nd->kwvals = kwv.v;
    nd->nkw = kwv.n;
    return 0;
}

/* A list, tuple or dict literal body after its opening bracket. */
static int parse_seq(parser_t *P, jnode_t *nd, int close, int dict)
{
    nvec_t items = {0};
    int err;
    while (!is_op(cur(P), close)) {
        if (items.n) {
            if ((err = expect_op(P, ',', dict ? "',' or '}' in a dict" : "',' or closing bracket")))
                return err;
            if (is_op(cur(P), close))
                break;
        }
        jnode_t *v;
        if ((err = parse_expr(P, &v)) || (err = nvec_push(P, &items, v)))
            return err;
        if (dict) {
            if ((err = expect_op(P, ':', "':' in a dict")) || (err = parse_expr(P, &v)) ||
                (err = nvec_push(P, &items, v)))
                return err;
        }
    }
    next(P);
    nd->list = items.v;
    nd->n = items.n;
    return 0;
}

static int parse_primary(parser_t *P, jnode_t **out)
{
    const jtok_t *t = cur(P);
    jnode_t *nd;
    int err;
    switch (t->type) {
    case TK_NAME:
        nd = node_new(P, N_CONST, t->line);
        if (!nd)
            return p_oom(P);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) {
            nd->cval = jv_bool(1);
        } else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            nd->cval = jv_bool(0);
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            nd->cval = jv_none();
        } else {
            nd->kind = N_NAME;
            nd->name = t->s;
        }
        next(P);
        break;
    case TK_STRING: {
        /* Adjacent string literals are one string, as in Python. */
        size_t total = 0, k = 0;
        while (peek(P, k)->type == TK_STRING)
            total += peek(P, k++)->len;
        jstr_t *s = jarena_alloc(P->a, sizeof *s + total + 1);
        nd = s ? node_new(P, N_CONST, t->line) : NULL;
        if (!nd)
            return p_oom(P);
        s->ascii = 1;
        s->prov = JPROV_TEMPLATE;
        while (cur(P)->type == TK_STRING) {
            memcpy(s->s + s->len, cur(P)->s, cur(P)->len);
            s->len += cur(P)->len;
            next(P);
        }
        for (size_t i = 0; i < s->len; i++)
            if ((unsigned char)s->s[i] >= 0x80)
                s->ascii = 0;
        nd->cval = jv_str(s);
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        nd = node_new(P, N_CONST, t->line);
        if (!nd)
            return p_oom(P);
        nd->cval = t->type == TK_INT ? jv_int(t->i) : jv_float(t->f);
        next(P);
        break;
    case TK_OP:
        if (t->op == '(') {
            next(P);
            if (is_op(cur(P), ')')) {
                next(P);
                nd = node_new(P, N_TUPLE, t->line);
                if (!nd)
                    return p_oom(P);
                break;
            }
            jnode_t *first;
            if ((err = parse_expr(P, &first)))
                return err;
            if (is_op(cur(P), ',')) {
                nd = node_new(P, N_TUPLE, t->line);
                nvec_t items = {0};
                if (!nd)
                    return p_oom(P);
                if ((err = nvec_push(P, &items, first)))
                    return err;
                while (is_op(cur(P), ',')) {
                    next(P);
                    if (is_op(cur(P), ')'))
                        break;
                    jnode_t *v;
                    if ((err = parse_expr(P, &v)) || (err = nvec_push(P, &items, v)))
                        return err;
                }
                nd->list = items.v;
                nd->n = items.n;
            } else {
                nd = first;
            }
            if ((err = expect_op(P, ')', "')'")))
                return err;
            break;
        }
        if (t->op == '[' || t->op == '{') {
            next(P);
            nd = node_new(P, t->op == '[' ? N_LIST : N_DICT, t->line);
            if (!nd)
                return p_oom(P);
            if ((err = parse_seq(P, nd, t->op == '[' ? ']' : '}', t->op == '{')))
                return err;
            break;
        }
        return p_fail(P, t->line, "unexpected operator in an expression%s", "");
    default:
        return p_fail(P, t->line, "expected an expression, found %s", tok_desc(t));
    }
    *out = nd;
    return 0;
}

/* [index] or [start:stop:step] after obj. */
static int parse_subscript(parser_t *P, jnode_t *obj, jnode_t **out)
{
    int line = cur(P)->line, err;
    next(P);
    jnode_t *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    for (;;) {
        if (is_op(cur(P), ']'))
            break;
        if (is_op(cur(P), ':')) {
            if (++colons > 2)
                return p_fail(P, cur(P)->line, "too many ':' in a slice%s", "");
            next(P);
            continue;
        }
        if (parts[colons])
            return p_fail(P, cur(P)->line, "expected ':' or ']' in a subscript%s", "");
        if ((err = parse_expr(P, &parts[colons])))
            return err;
    }
    next(P);
    jnode_t *nd = node_new(P, colons ? N_SLICE : N_ITEM, line);
    if (!nd)
        return p_oom(P);
    nd->a = obj;
    if (colons) {
        nd->b = parts[0];
        nd->c = parts[1];
        nd->d = parts[2];
    } else {
        if (!parts[0])
            return p_fail(P, line, "empty subscript%s", "");
        nd->b = parts[0];
    }
    *out = nd;
    return 0;
}

static int parse_postfix(parser_t *P, jnode_t *nd, jnode_t **out)
{
    int err, added = 0;
    for (;;) {
        const jtok_t *t = cur(P);
        if (is_op(t, '.') || is_op(t, '[') || is_op(t, '(') || is_op(t, '|') || is_name(t, "is")) {
            /* Each step wraps the node: the tree gets one deeper. */
            if ((err = enter(P)))
                return err;
            added++;
        }
        if (is_op(t, '.')) {
            next(P);
            const jtok_t *a = cur(P);
            if (a->type == TK_NAME) {
                jnode_t *g = node_new(P, N_ATTR, a->line);
                if (!g)
                    return p_oom(P);
                g->a = nd;
                g->name = a->s;
                nd = g;
                next(P);
            } else if (a->type == TK_INT) {
                jnode_t *g = node_new(P, N_ITEM, a->line), *k = node_new(P, N_CONST, a->line);
                if (!g || !k)
                    return p_oom(P);
                k->cval = jv_int(a->i);
                g->a = nd;
                g->b = k;
                nd = g;
                next(P);
            } else {
                return p_fail(P, a->line, "expected an attribute name after '.'%s", "");
            }
        } else if (is_op(t, '[')) {
            if ((err = parse_subscript(P, nd, &nd)))
                return err;
        } else if (is_op(t, '(')) {
            jnode_t *c = node_new(P, N_CALL, t->line);
            if (!c)
                return p_oom(P);
            c->a = nd;
            if ((err = parse_call_args(P, c)))
                return err;
            nd = c;
        } else {
            break;
        }
    }
    P->nest -= added;
    *out = nd;
    return 0;
}

/* |filter(args), "is [not] test [arg]" and calls after them. */
static int parse_filter_expr(parser_t *P, jnode_t *nd, jnode_t **out)
{
    int err, added = 0;
    for (;;) {
        const jtok_t *t = cur(P);
        if (is_op(t, '.') || is_op(t, '[') || is_op(t, '(') || is_op(t, '|') || is_name(t, "is")) {
            /* Each step wraps the node: the tree gets one deeper. */
            if ((err = enter(P)))
                return err;
            added++;
        }
        if (is_op(t, '|')) {
            next(P);
            const jtok_t *f = cur(P);
            if (f->type != TK_NAME)
                return p_fail(P, f->line, "expected a filter name after '|'%s", "");
            const jbuiltin_t *b = jinja_filter_find(f->s);
            if (!b)
                return p_fail(P, f->line, "no filter named '%s'", f->s);
            jnode_t *g = node_new(P, N_FILTER, f->line);
            if (!g)
                return p_oom(P);
            g->a = nd;
            g->fn = b;
            g->name = f->s;
            next(P);
            if (is_op(cur(P), '(') && (err = parse_call_args(P, g)))
                return err;
            nd = g;
        } else if (is_name(t, "is")) {
            next(P);
            int negate = 0;
            if (is_name(cur(P), "not")) {
                negate = 1;
                next(P);
            }
            const jtok_t *f = cur(P);
            if (f->type != TK_NAME)
                return p_fail(P, f->line, "expected a test name after 'is'%s", "");
            const jbuiltin_t *b = jinja_test_find(f->s);
            if (!b)
                return p_fail(P, f->line, "no test named '%s'", f->s);
            jnode_t *g = node_new(P, N_TEST, f->line);
            if (!g)
                return p_oom(P);
            g->a = nd;
            g->fn = b;
            g->name = f->s;
            g->op = negate;
            next(P);
            const jtok_t *n2 = cur(P);
            if (is_op(n2, '(')) {
                if ((err = parse_call_args(P, g)))
                    return err;
            } else if ((n2->type == TK_NAME || n2->type == TK_STRING || n2->type == TK_INT ||
                        n2->type == TK_FLOAT || is_op(n2, '[') || is_op(n2, '{')) &&
                       !is_name(n2, "else") && !is_name(n2, "or") && !is_name(n2, "and") &&
                       !is_name(n2, "is")) {
                /* One argument without parentheses: "is divisibleby 3". */
                jnode_t *arg;
                if ((err = parse_primary(P, &arg)) || (err = parse_postfix(P, arg, &arg)))
                    return err;
                g->list = jarena_alloc(P->a, sizeof *g->list);
                if (!g->list)
                    return p_oom(P);
                g->list[0] = arg;
                g->n = 1;
            }
            nd = g;
        } else if (is_op(t, '(')) {
            jnode_t *c = node_new(P, N_CALL, t->line);
            if (!c)
                return p_oom(P);
            c->a = nd;
            if ((err = parse_call_args(P, c)))
                return err;
            nd = c;
        } else {
            break;
        }
    }
    P->nest -= added;
    *out = nd;
    return 0;
}

static int parse_unary(parser_t *P, int with_filter, jnode_t **out)
{
    int err = enter(P);
    if (err)
        return err;
    const jtok_t *t = cur(P);
    jnode_t *nd;
    if (is_op(t, '-') || is_op(t, '+')) {
        next(P);
        jnode_t *inner;
        if ((err = parse_unary(P, 0, &inner)))
            return err;
        nd = node_new(P, t->op == '-' ? N_NEG : N_POS, t->line);
        if (!nd)
            return p_oom(P);
        nd->a = inner;
    } else {
        if ((err = parse_primary(P, &nd)))
            return err;
    }
    if ((err = parse_postfix(P, nd, &nd)))
        return err;
    if (with_filter && (err = parse_filter_expr(P, nd, &nd)))
        return err;
    P->nest--;
    *out = nd;
    return 0;
}

static int binop(parser_t *P, int op, int line, jnode_t *a, jnode_t *b, jnode_t **out)
{
    jnode_t *nd = node_new(P, N_BIN, line);
    if (!nd)
        return p_oom(P);
    nd->op = op;
    nd->a = a;
    nd->b = b;
    *out = nd;
    return 0;
}

static int parse_pow(parser_t *P, jnode_t **out)
{
    jnode_t *l = NULL, *r;
    int added = 0; /* each operator deepens the tree by one */
    int err = parse_unary(P, 1, &l);
    while (!err && is_op(cur(P), OP_POW)) {
        int line = cur(P)->line;
        next(P);
        if ((err = enter(P)))
            break;
        added++;
        if (!(err = parse_unary(P, 1, &r)))
            err = binop(P, OP_POW, line, l, r, &l);
    }
    P->nest -= added;
    *out = l;
    return err;
}

static int parse_math2(parser_t *P, jnode_t **out)
{
    jnode_t *l = NULL, *r;
    int added = 0; /* each operator deepens the tree by one */
    int err = parse_pow(P, &l);
    while (!err && (is_op(cur(P), '*') || is_op(cur(P), '/') || is_op(cur(P), OP_FLOORDIV) ||
                    is_op(cur(P), '%'))) {
        int op = cur(P)->op, line = cur(P)->line;
        next(P);
        if ((err = enter(P)))
            break;
        added++;
        if (!(err = parse_pow(P, &r)))
            err = binop(P, op, line, l, r, &l);
    }
    P->nest -= added;
    *out = l;
    return err;
}

static int parse_concat(parser_t *P, jnode_t **out)
{
    jnode_t *l = NULL, *r;
    int added = 0; /* each operator deepens the tree by one */
    int err = parse_math2(P, &l);
    while (!err && is_op(cur(P), '~')) {
        int line = cur(P)->line;
        next(P);
        if ((err = enter(P)))
            break;
        added++;
        if (!(err = parse_math2(P, &r)))
            err = binop(P, '~', line, l, r, &l);
    }
    P->nest -= added;
    *out = l;
    return err;
}

static int parse_math1(parser_t *P, jnode_t **out)
{
    jnode_t *l = NULL, *r;
    int added = 0; /* each operator deepens the tree by one */
    int err = parse_concat(P, &l);
    while (!err && (is_op(cur(P), '+') || is_op(cur(P), '-'))) {
        int op = cur(P)->op, line = cur(P)->line;
        next(P);
        if ((err = enter(P)))
            break;
        added++;
        if (!(err = parse_concat(P, &r)))
            err = binop(P, op, line, l, r, &l);
    }
    P->nest -= added;
    *out = l;
    return err;
}

static int cmp_op(const parser_t *P, size_t *skip)
{
    const jtok_t *t = cur(P);
    *skip = 1;
    if (t->type == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == '<' || t->op == '>' ||
                             t->op == OP_LE || t->op == OP_GE))
        return t->op;
    if (is_name(t, "in"))
        return OP_IN;
    if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
        *skip = 2;
        return OP_NOTIN;
    }
    return 0;
}

static int parse_compare(parser_t *P, jnode_t **out)
{
    jnode_t *first;
    int err = parse_math1(P, &first);
    if (err)
        return err;
    size_t skip;
    int op = cmp_op(P, &skip);
    if (!op) {
        *out = first;
        return 0;
    }
    jnode_t *nd = node_new(P, N_CMP, cur(P)->line);
    if (!nd)
        return p_oom(P);
    nvec_t items = {0};
    int ops[64];
    size_t nops = 0;
    if ((err = nvec_push(P, &items, first)))
        return err;
    while (op) {
        if (nops == sizeof ops / sizeof ops[0])
            return p_fail(P, cur(P)->line, "comparison chain too long%s", "");
        ops[nops++] = op;
        for (size_t k = 0; k < skip; k++)
            next(P);
        jnode_t *r;
        if ((err = parse_math1(P, &r)) || (err = nvec_push(P, &items, r)))
            return err;
        op = cmp_op(P, &skip);
    }
    nd->ops = jarena_alloc(P->a, nops * sizeof *nd->ops);
    if (!nd->ops)
        return p_oom(P);
    memcpy(nd->ops, ops, nops * sizeof *ops);
    nd->list = items.v;
    nd->n = items.n;
    *out = nd;
    return 0;
}

static int parse_not(parser_t *P, jnode_t **out)
{
    if (is_name(cur(P), "not")) {
        int line = cur(P)->line, err = enter(P);
        if (err)
            return err;
        next(P);
        jnode_t *inner;
        if ((err = parse_not(P, &inner)))
            return err;
        jnode_t *nd = node_new(P, N_NOT, line);
        if (!nd)
            return p_oom(P);
        nd->a = inner;
        P->nest--;
        *out = nd;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(parser_t *P, jnode_t **out)
{
    jnode_t *l = NULL, *r;
    int added = 0;
    int err = parse_not(P, &l);
    while (!err && is_name(cur(P), "and")) {
        int line = cur(P)->line;
        next(P);
        if ((err = enter(P)))
            break;
        added++;
        if (!(err = parse_not(P, &r))) {
            jnode_t *nd = node_new(P, N_AND, line);
            if (!nd)
                return p_oom(P);
            nd->a = l;
            nd->b = r;
            l = nd;
        }
    }
    P->nest -= added;
    *out = l;
    return err;
}

static int parse_or(parser_t *P, jnode_t **out)
{
    jnode_t *l = NULL, *r;
    int added = 0;
    int err = parse_and(P, &l);
    while (!err && is_name(cur(P), "or")) {
        int line = cur(P)->line;
        next(P);
        if ((err = enter(P)))
            break;
        added++;
        if (!(err = parse_and(P, &r))) {
            jnode_t *nd = node_new(P, N_OR, line);
            if (!nd)
                return p_oom(P);
            nd->a = l;
            nd->b = r;
            l = nd;
        }
    }
    P->nest -= added;
    *out = l;
    return err;
}

/* The full expression: or-expressions with "a if b else c". */
static int parse_expr(parser_t *P, jnode_t **out)
{
    int err = enter(P);
    if (err)
        return err;
    jnode_t *l;
    if ((err = parse_or(P, &l)))
        return err;
    while (is_name(cur(P), "if")) {
        int line = cur(P)->line;
        next(P);
        jnode_t *cond, *other = NULL;
        if ((err = parse_or(P, &cond)))
            return err;
        if (is_name(cur(P), "else")) {
            next(P);
            if ((err = parse_expr(P, &other)))
                return err;
        }
        jnode_t *nd = node_new(P, N_COND, line);
        if (!nd)
            return p_oom(P);
        nd->a = l;
        nd->b = cond;
        nd->c = other;
        l = nd;
    }
    P->nest--;
    *out = l;
    return 0;
}

static int tuple_end(const parser_t *P)
{
    const jtok_t *t = cur(P);
    return t->type == TK_VAR_END || t->type == TK_BLOCK_END || is_op(t, ')') ||
           is_name(t, "if") || is_name(t, "recursive");
}

/* An expression, or several separated by commas (a tuple without parentheses).
 * with_cond 0: the for loop's iterable, where "if" starts the loop's filter. */
static int parse_tuple(parser_t *P, int with_cond, jnode_t **out)
{
    int line = cur(P)->line, err;
    jnode_t *first;
    if ((err = with_cond ? parse_expr(P, &first) : parse_or(P, &first)))
        return err;
    if (!is_op(cur(P), ',')) {
        *out = first;
        return 0;
    }
    nvec_t items = {0};
    if ((err = nvec_push(P, &items, first)))
        return err;
    while (is_op(cur(P), ',')) {
        next(P);
        if (tuple_end(P))
            break;
        jnode_t *v;
        if ((err = with_cond ? parse_expr(P, &v) : parse_or(P, &v)) ||
            (err = nvec_push(P, &items, v)))
            return err;
    }
    jnode_t *nd = node_new(P, N_TUPLE, line);
    if (!nd)
        return p_oom(P);
    nd->list = items.v;
    nd->n = items.n;
    *out = nd;
    return 0;
}

/* An assignment target: a name, names separated by commas (optionally in parentheses),
 * or, when attr is allowed, name.attr (a namespace's attribute). */
static int parse_target(parser_t *P, int attr, jnode_t **out)
{
    int line = cur(P)->line, paren = 0, err;
    if (is_op(cur(P), '(')) {
        paren = 1;
        next(P);
    }
    nvec_t names = {0};
    for (;;) {
        const jtok_t *t = cur(P);
        if (t->type != TK_NAME)
            return p_fail(P, t->line, "expected a name to assign to, found %s", tok_desc(t));
        jnode_t *nd = node_new(P, N_NAME, t->line);
        if (!nd)
            return p_oom(P);
        nd->name = t->s;
        next(P);
        if (attr && !paren && names.n == 0 && is_op(cur(P), '.')) {
            next(P);
            if (cur(P)->type != TK_NAME)
                return p_fail(P, cur(P)->line, "expected an attribute name after '.'%s", "");
            jnode_t *g = node_new(P, N_ATTR, cur(P)->line);
            if (!g)
                return p_oom(P);
            g->a = nd;
            g->name = cur(P)->s;
            next(P);
            *out = g;
            return 0;
        }
        if ((err = nvec_push(P, &names, nd)))
            return err;
        if (!is_op(cur(P), ','))
            break;
        next(P);
        if (paren && is_op(cur(P), ')'))
            break;
    }
    if (paren && (err = expect_op(P, ')', "')'")))
        return err;
    if (names.n == 1 && !paren) {
        *out = names.v[0];
        return 0;
    }
    jnode_t *nd = node_new(P, N_TUPLE, line);
    if (!nd)
        return p_oom(P);
    nd->list = names.v;
    nd->n = names.n;
    *out = nd;
    return 0;
}

static int parse_body(parser_t *P, const char *const *ends, jnode_t **out, const char **which);

/* The body of a block up to one of ends; consumes the end tag's name (the caller its
 * block end). */
static int parse_block(parser_t *P, const char *const *ends, jnode_t **body, const char **which)
{
    int err = parse_body(P, ends, body, which);
    if (err)
        return err;
    next(P); /* the end tag's name */
    return 0;
}

static int parse_if(parser_t *P, int line, jnode_t **out)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    jnode_t *nd = node_new(P, S_IF, line);
    if (!nd)
        return p_oom(P);
    const char *which;
    int err;
    if ((err = parse_tuple(P, 1, &nd->a)) || (err = expect_block_end(P)) ||
        (err = parse_block(P, ends, &nd->b, &which)))
        return err;
    if (!strcmp(which, "elif")) {
        if ((err = enter(P)) || (err = parse_if(P, cur(P)->line, &nd->c)))
            return err;
        P->nest--;
        *out = nd;
        return 0; /* the nested if consumed the endif */
    }
    if (!strcmp(which, "else")) {
        if ((err = expect_block_end(P)) || (err = parse_block(P, endif, &nd->c, &which)))
            return err;
    }
    if ((err = expect_block_end(P)))
        return err;
    *out = nd;
    return 0;
}

static int parse_for(parser_t *P, int line, jnode_t **out)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    jnode_t *nd = node_new(P, S_FOR, line);
    if (!nd)
        return p_oom(P);
    const char *which;
    int err;
    if ((err = parse_target(P, 0, &nd->a)))
        return err;
    if (!is_name(cur(P), "in"))
        return p_fail(P, cur(P)->line, "expected 'in' in a for loop%s", "");
    next(P);
    if ((err = parse_tuple(P, 0, &nd->b)))
        return err;
    if (is_name(cur(P), "if")) {
        next(P);
        if ((err = parse_expr(P, &nd->e)))
            return err;
    }
    if (is_name(cur(P), "recursive"))
        return p_fail(P, cur(P)->line, "recursive for loops are not supported%s", "");
    if ((err = expect_block_end(P)))
        return err;
    P->loop_depth++;
    err = parse_block(P, ends, &nd->c, &which);
    P->loop_depth--;
    if (err)
        return err;
    if (!strcmp(which, "else")) {
        if ((err = expect_block_end(P)) || (err = parse_block(P, endfor, &nd->d, &which)))
            return err;
    }
    if ((err = expect_block_end(P)))
        return err;
    *out = nd;
    return 0;
}

static int parse_set(parser_t *P, int line, jnode_t **out)
{
    static const char *const ends[] = {"endset", NULL};
    jnode_t *nd = node_new(P, S_SET, line);
    if (!nd)
        return p_oom(P);
    int err;
    const char *which;
    if ((err = parse_target(P, 1, &nd->a)))
        return err;
    if (is_op(cur(P), '=')) {
        next(P);
        if ((err = parse_tuple(P, 1, &nd->b)) || (err = expect_block_end(P)))
            return err;
    } else {
        if (nd->a->kind != N_NAME)
            return p_fail(P, line, "a block set assigns one name%s", "");
        nd->kind = S_SETBLOCK;
        if ((err = expect_block_end(P)) || (err = parse_block(P, ends, &nd->c, &which)) ||
            (err = expect_block_end(P)))
            return err;
    }
    *out = nd;
    return 0;
}

/* "(" name [= default], ... ")" of a macro or a call block's caller. */
static int parse_params(parser_t *P, jnode_t *nd)
{
    nvec_t params = {0};
    int err;
    if ((err = expect_op(P, '(', "'(' after the macro name")))
        return err;
    while (!is_op(cur(P), ')')) {
        if (params.n && (err = expect_op(P, ',', "',' or ')' in the parameters")))
            return err;
        if (is_op(cur(P), ')'))
            break;
        if (cur(P)->type != TK_NAME)
            return p_fail(P, cur(P)->line, "expected a parameter name%s", "");
        jnode_t *pn = node_new(P, N_NAME, cur(P)->line);
        if (!pn)
            return p_oom(P);
        pn->name = cur(P)->s;
        next(P);
        if (is_op(cur(P), '=')) {
            next(P);
            if ((err = parse_expr(P, &pn->a)))
                return err;
        }
        if ((err = nvec_push(P, &params, pn)))
            return err;
    }
    next(P);
    nd->list = params.v;
    nd->n = params.n;
    return 0;
}

static int parse_macro(parser_t *P, int line, jnode_t **out)
{
    static const char *const ends[] = {"endmacro", NULL};
    jnode_t *nd = node_new(P, S_MACRO, line);
    if (!nd)
        return p_oom(P);
    if (cur(P)->type != TK_NAME)
        return p_fail(P, cur(P)->line, "expected a macro name%s", "");
    nd->name = cur(P)->s;
    next(P);
    const char *which;
    int err, saved = P->loop_depth;
    P->loop_depth = 0;
    if ((err = parse_params(P, nd)) || (err = expect_block_end(P)) ||
        (err = parse_block(P, ends, &nd->c, &which)))
        return err;
    P->loop_depth = saved;
    if (cur(P)->type == TK_NAME && !strcmp(cur(P)->s, nd->name))
        next(P);
    if ((err = expect_block_end(P)))
        return err;
    *out = nd;
    return 0;
}

static int parse_callblock(parser_t *P, int line, jnode_t **out)
{
    static const char *const ends[] = {"endcall", NULL};
    jnode_t *nd = node_new(P, S_CALLBLOCK, line);
    if (!nd)
        return p_oom(P);
    int err, saved = P->loop_depth;
    const char *which;
    if (is_op(cur(P), '(') && (err = parse_params(P, nd)))
        return err;
    if ((err = parse_expr(P, &nd->a)))
        return err;
    if (nd->a->kind != N_CALL)
        return p_fail(P, line, "expected a call after 'call'%s", "");
    P->loop_depth = 0;
    if ((err = expect_block_end(P)) || (err = parse_block(P, ends, &nd->c, &which)))
        return err;
    P->loop_depth = saved;
    if ((err = expect_block_end(P)))
        return err;
    *out = nd;
    return 0;
}

static int parse_filterblock(parser_t *P, int line, jnode_t **out)
{
    static const char *const ends[] = {"endfilter", NULL};
    jnode_t *nd = node_new(P, S_FILTERBLOCK, line);
    if (!nd)
        return p_oom(P);
    jnode_t *chain = NULL;
    int err;
    for (;;) {
        const jtok_t *f = cur(P);
        if (f->type != TK_NAME)
            return p_fail(P, f->line, "expected a filter name%s", "");
        const jbuiltin_t *b = jinja_filter_find(f->s);
        if (!b)
            return p_fail(P, f->line, "no filter named '%s'", f->s);
        jnode_t *g = node_new(P, N_FILTER, f->line);
        if (!g)
            return p_oom(P);
        g->a = chain;
        g->fn = b;
        g->name = f->s;
        next(P);
        if (is_op(cur(P), '(') && (err = parse_call_args(P, g)))
            return err;
        chain = g;
        if (!is_op(cur(P), '|'))
            break;
        next(P);
    }
    nd->a = chain;
    const char *which;
    if ((err = expect_block_end(P)) || (err = parse_block(P, ends, &nd->c, &which)) ||
        (err = expect_block_end(P)))
        return err;
    *out = nd;
    return 0;
}

/* One statement after "{%". */
static int parse_statement(parser_t *P, jnode_t **out)
{
    const jtok_t *t = cur(P);
    int line = t->line, err;
    if (t->type != TK_NAME)
        return p_fail(P, line, "expected a tag name after '{%%', found %s", tok_desc(t));
    const char *nm = t->s;
    next(P);
    if ((err = enter(P)))
        return err;
    if (!strcmp(nm, "if")) {
        err = parse_if(P, line, out);
    } else if (!strcmp(nm, "for")) {
        err = parse_for(P, line, out);
    } else if (!strcmp(nm, "set")) {
        err = parse_set(P, line, out);
    } else if (!strcmp(nm, "macro")) {
        err = parse_macro(P, line, out);
    } else if (!strcmp(nm, "call")) {
        err = parse_callblock(P, line, out);
    } else if (!strcmp(nm, "filter")) {
        err = parse_filterblock(P, line, out);
    } else if (!strcmp(nm, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        if (!(err = expect_block_end(P)) && !(err = parse_block(P, ends, out, &which)))
            err = expect_block_end(P);
    } else if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
        if (!P->loop_depth)
            return p_fail(P, line, "'%s' outside of a for loop", nm);
        *out = node_new(P, nm[0] == 'b' ? S_BREAK : S_CONTINUE, line);
        if (!*out)
            return p_oom(P);
        err = expect_block_end(P);
    } else {
        return p_fail(P, line, "unknown tag '%s'", nm);
    }
    P->nest--;
    return err;
}

static int parse_body(parser_t *P, const char *const *ends, jnode_t **out, const char **which)
{
    nvec_t stmts = {0};
    int line = cur(P)->line, err;
    jnode_t *body = node_new(P, S_BODY, line);
    if (!body)
        return p_oom(P);
    for (;;) {
        const jtok_t *t = cur(P);
        jnode_t *nd = NULL;
        if (t->type == TK_EOF) {
            if (ends) {
                size_t k = 0;
                while (ends[k + 1])
                    k++;
                return p_fail(P, t->line, "unexpected end of template: '%s' missing", ends[k]);
            }
            break;
        } else if (t->type == TK_DATA) {
            nd = node_new(P, S_DATA, t->line);
            jstr_t *s = jarena_alloc(P->a, sizeof *s + t->len + 1);
            if (!nd || !s)
                return p_oom(P);
            memcpy(s->s, t->s, t->len);
            s->len = t->len;
            s->ascii = 1;
            s->prov = JPROV_TEMPLATE;
            for (size_t i = 0; i < s->len; i++)
                if ((unsigned char)s->s[i] >= 0x80)
                    s->ascii = 0;
            nd->cval = jv_str(s);
            next(P);
        } else if (t->type == TK_VAR_BEGIN) {
            nd = node_new(P, S_PRINT, t->line);
            if (!nd)
                return p_oom(P);
            next(P);
            if ((err = parse_tuple(P, 1, &nd->a)))
                return err;
            if (cur(P)->type != TK_VAR_END)
                return p_fail(P, cur(P)->line, "expected '}}', found %s", tok_desc(cur(P)));
            next(P);
        } else if (t->type == TK_BLOCK_BEGIN) {
            const jtok_t *nm = peek(P, 1);
            if (nm->type == TK_NAME && ends) {
                for (size_t i = 0; ends[i]; i++)
                    if (!strcmp(nm->s, ends[i])) {
                        next(P);
                        *which = ends[i];
                        body->list = stmts.v;
                        body->n = stmts.n;
                        *out = body;
                        return 0;
                    }
            }
            if (nm->type == TK_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "else") ||
                                        !strcmp(nm->s, "elif")))
                return p_fail(P, nm->line, ends ? "unexpected '%s'" : "'%s' without a block to close",
                              nm->s);
            next(P);
            if ((err = parse_statement(P, &nd)))
                return err;
        } else {
            return p_fail(P, t->line, "unexpected %s", tok_desc(t));
        }
        if ((err = nvec_push(P, &stmts, nd)))
            return err;
    }
    body->list = stmts.v;
    body->n = stmts.n;
    *out = body;
    return 0;
}

int jinja_parse(jarena_t *a, const char *name, const jtok_t *toks, size_t n, jnode_t **root)
{
    parser_t P = {.a = a, .name = name, .t = toks, .n = n};
    const char *which = NULL;
    return parse_body(&P, NULL, root, &which);
}
