/* Post-processors of a Hugging Face tokenizer.json: a table of the supported types, each
 * read into one template of special ids around the sequence (TemplateProcessing's single
 * template, or Roberta's and Bert's cls ... sep), and the application of the templates to
 * encoded ids. The first special ids before and after the sequence are the tokenizer's BOS
 * and EOS unless tokenizer_config.json names others. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/hf_internal.h"

typedef struct post_kind {
    const char *name;
    int (*parse)(tokenizer_t *t, const json_t *o, const char *name);
} post_kind_t;

static int tmpl_push(tokenizer_t *t, int32_t v)
{
    hf_tok_t *h = t->hf;
    int32_t *p = realloc(h->tmpl, (h->n_tmpl + 1) * sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    h->tmpl = p;
    p[h->n_tmpl++] = v;
    return 0;
}

/* ByteLevel only adjusts offsets. */
static int post_bytelevel(tokenizer_t *t, const json_t *o, const char *name)
{
    (void)t, (void)o, (void)name;
    return 0;
}

static int post_template(tokenizer_t *t, const json_t *o, const char *name)
{
    (void)name;
    hf_tok_t *h = t->hf;
    json_t *single = json_object_get(o, "single");
    json_t *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single))
        return river_err_set(RIVER_EFORMAT, "%s: TemplateProcessing without a single template",
                             t->path);
    int seen_seq = 0, err = 0;
    for (size_t i = 0; i < json_array_size(single) && !err; i++) {
        json_t *item = json_array_get(single, i);
        json_t *st = json_object_get(item, "SpecialToken");
        json_t *sq = json_object_get(item, "Sequence");
        if (sq) {
            const char *which = hf_jstr(sq, "id", NULL);
            /* A single sequence has only A. */
            if (!which || !strcmp(which, "A")) {
                err = tmpl_push(t, -1);
                seen_seq = 1;
            }
            continue;
        }
        const char *tok = hf_jstr(st, "id", NULL);
        json_t *spec = tok ? json_object_get(specials, tok) : NULL;
        json_t *ids = json_object_get(spec, "ids");
        if (!json_is_array(ids))
            return river_err_set(RIVER_EFORMAT, "%s: template special token \"%s\" has no ids",
                                 t->path, tok ? tok : "?");
        for (size_t k = 0; k < json_array_size(ids) && !err; k++) {
            int64_t v;
            if (!hf_jint(json_array_get(ids, k), &v) || v < 0 || v >= INT32_MAX)
                return river_err_set(
                    RIVER_EFORMAT, "%s: template special token \"%s\" has a bad id", t->path, tok);
            if (k == 0 && !seen_seq && h->tmpl_bos < 0)
                h->tmpl_bos = (int32_t)v;
            if (k == 0 && seen_seq && h->tmpl_eos < 0)
                h->tmpl_eos = (int32_t)v;
            err = tmpl_push(t, (int32_t)v);
        }
    }
    return err ? err : tmpl_push(t, -2);
}

/* RobertaProcessing and BertProcessing: [cls] sequence [sep]. */
static int post_cls_sep(tokenizer_t *t, const json_t *o, const char *name)
{
    hf_tok_t *h = t->hf;
    json_t *cls = json_object_get(o, "cls"), *sep = json_object_get(o, "sep");
    int64_t c, s;
    int err;
    if (!hf_jint(json_array_get(cls, 1), &c) || !hf_jint(json_array_get(sep, 1), &s) || c < 0 ||
        s < 0 || c >= INT32_MAX || s >= INT32_MAX)
        return river_err_set(RIVER_EFORMAT, "%s: %s without cls/sep ids", t->path, name);
    if (h->tmpl_bos < 0)
        h->tmpl_bos = (int32_t)c;
    if (h->tmpl_eos < 0)
        h->tmpl_eos = (int32_t)s;
    if ((err = tmpl_push(t, (int32_t)c)) || (err = tmpl_push(t, -1)) ||
        (err = tmpl_push(t, (int32_t)s)))
        return err;
    return tmpl_push(t, -2);
}

static const post_kind_t post_kinds[] = {
    {"ByteLevel", post_bytelevel},
    {"TemplateProcessing", post_template},
    {"RobertaProcessing", post_cls_sep},
    {"BertProcessing", post_cls_sep},
};

int hf_parse_post(tokenizer_t *t, const json_t *o, int depth)
{
    if (!o || json_is_null(o))
        return 0;
    const void *kind;
    hf_kinds_t kinds = {post_kinds, sizeof post_kinds / sizeof post_kinds[0], sizeof post_kinds[0]};
    int err =
        hf_parse_step(t, o, depth, "post_processor", "processors", hf_parse_post, kinds, &kind);
    if (err)
        return err < 0 ? err : 0;
    const post_kind_t *k = kind;
    return k->parse(t, o, k->name);
}

int hf_post_apply(const hf_tok_t *h, tok_ids_t *ids, tok_ids_t *tmp)
{
    size_t k = 0;
    while (k < h->n_tmpl) {
        tmp->len = 0;
        for (; k < h->n_tmpl && h->tmpl[k] != -2; k++) {
            int err = h->tmpl[k] == -1 ? tok_ids_append(tmp, ids->p, ids->len)
                                       : tok_ids_push(tmp, h->tmpl[k]);
            if (err)
                return err;
        }
        k++;
        tok_ids_t x = *ids;
        *ids = *tmp;
        *tmp = x;
    }
    return 0;
}
