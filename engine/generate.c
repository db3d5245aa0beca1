#include "engine/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"

typedef struct gseq {
    int used;
    int id;
    gen_request_t req;     /* stop strings and callback borrowed from the caller */
    /* Prompt, done ids and every generated id, in order (n_ids of cap_ids). Its first
     * n_prompt are what prefill writes: the prompt and done ids at first, everything up to
     * the last sampled id after a preemption. */
    int32_t *ids;
    size_t n_ids, cap_ids;
    size_t n_prompt;
    size_t n_prefilled;    /* prompt positions whose K/V are written */
    int32_t last;          /* last sampled id, fed at position `pos` */
    int pos;               /* next position to write */
    int n_generated;       /* done ids included */
    int swapped;           /* preempted and not restarted: waits until its prefill fits */
    int err;               /* why it ends with GEN_FINISH_ERROR (gen_event_t.err) */
    unsigned mark;         /* step number of the last batch it has rows in */
    kv_seq_t kv;
    prefix_seq_t px;       /* provenance and names of its pages, with the prefix cache */
    int cached_tokens;     /* gen_event_t.cached_tokens */
    int looked_up;         /* its first prefill asked the prefix cache */
    exit_seq_t exit;
    exit_row_t row_exit;   /* the request's own thresholds, when has_row_exit */
    int has_row_exit;
    sampler_t *sampler;
    tok_stream_t *stream;
    char *pending;         /* text held back because it may start a stop string */
    size_t n_pending, cap_pending;
    /* Lossless mode: the draft of the current round, fed at positions pos.. after last. */
    int lossless;
    int k_cap;             /* most draft tokens per verify pass */
    int n_draft;           /* draft ids so far this round */
    int verifying;         /* the draft is complete: the next batch verifies it */
    int draft_ngram;       /* this round's draft came from the n-gram lookup: no draft rows
                              ran, so its verify rows start at layer 0 */
    int32_t draft[GEN_DRAFT_MAX];
    float *q;              /* (k_cap, vocab) the draft's distributions; sampling only */
    /* Draft row j computed the exact backbone up to layer reuse[j] (the least exit layer
     * of rows 0..j: above a row's exit, later rows attend to river K/V); its residual
     * stream there is h row j, where the verify pass resumes it. */
    float *h;              /* (k_cap, dim) */
    int32_t reuse[GEN_DRAFT_MAX];
    int drafted, accepted; /* draft tokens verified and accepted, whole completion */
    int drafts;            /* verify passes with at least one draft token */
    /* Constrained decoding: the grammar's state after every accepted id, and in lossless
     * mode its state after the current round's draft too (NULL: no grammar). */
    grammar_state_t *gram;
    grammar_state_t *gram_draft;
    logits_logprob_t lp;   /* the log-probabilities of the id being accepted, when asked */
} gseq_t;

/* What a batch row does for its sequence. */
enum { ROW_PLAIN = 0, ROW_DRAFT, ROW_VERIFY };

struct gen {
    const model_t *m;
    const tokenizer_t *tok;
    backend_t *be;
    gen_config_t cfg;
    forward_t *fwd;
    kv_pool_t *kv;
    int owns_kv;           /* 0: cfg.kv_pool, borrowed */
    prefix_cache_t *pc;    /* NULL: no prefix cache */
    int pc_on;             /* new sequences use it (off under a strategy it cannot serve) */
    int exit_on;           /* gen_set_exit gave a policy */
    gseq_t *seqs;          /* (max_seqs) slots */
    int *order;            /* (max_seqs) slots of live sequences, oldest first */
    int n_active;
    int next_id;
    unsigned n_steps;
    /* Batch assembly, (max_rows) each. */
    int32_t *tokens, *pos, *logit_rows, *row_seq, *group, *depth;
    exit_row_t *row_exit;  /* (max_rows) */
    exit_policy_t policy;  /* the one set with gen_set_exit, for requests without their own */
    const int32_t **tables;
    exit_seq_t **exit_seqs;
    exit_agg_t agg;
    float *logits;         /* (max_rows, vocab) host */
    uint8_t *row_kind;     /* (max_rows) ROW_PLAIN, ROW_DRAFT or ROW_VERIFY */
    int32_t *row_logit;    /* (max_rows) the row's index among the logit rows, or -1 */
    float *probs;          /* (vocab) the backbone's distribution at a verified position */
    int32_t *start_layer;  /* (max_rows) where each row resumes (verify rows) */
    int32_t *save_layer;   /* (max_rows) where each row's stream is kept (draft rows) */
    float *start_hidden;   /* (max_rows, dim) host */
    float *saved_hidden;   /* (max_rows, dim) host */
    int has_exit;          /* an exit policy is on (lossless mode drafts with it) */
    gen_spec_t spec;
    spec_costs_t costs;    /* spec.costs copied (spec.costs points here) */
    int k_now;             /* the draft length rounds use now: spec.k_max, or the pick */
    gen_stats_t stats;
    /* Constrained decoding, made at the first request with a grammar: the tokenizer's
     * vocabulary as the grammar sees it, and one mask's scratch. */
    grammar_vocab_t *gvocab;
    uint32_t *allowed;     /* ((vocab + 31) / 32) words */
};

static const char *const gen__source_names[] = {"river", "ngram", "both"};

const char *gen_draft_source_name(gen_draft_source_t s)
{
    return (unsigned)s <= GEN_DRAFT_BOTH ? gen__source_names[s] : "unknown";
}

int gen_draft_source_parse(const char *name)
{
    for (int i = 0; i <= GEN_DRAFT_BOTH; i++)
        if (!strcmp(name, gen__source_names[i]))
            return i;
    return -1;
}

const char *gen_finish_name(gen_finish_t f)
{
    static const char *names[] = {"running", "length", "eos", "stop", "context", "cancel",
                                  "error"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "unknown";
}

const char *const gen_kv_dtype_names[] = {"auto", "f32", "f16", "bf16", "q8", NULL};

dtype_t gen_kv_dtype(const model_t *m, int choice)
{
    /* In the order of gen_kv_dtype_t. */
    static const dtype_t chosen[GEN_KV_COUNT] = {DTYPE_COUNT, DTYPE_F32, DTYPE_F16,
                                                 DTYPE_BF16, DTYPE_Q8};
    if (choice > GEN_KV_AUTO && choice < GEN_KV_COUNT)
        return chosen[choice];
    /* The first layer's query matrix stands for the backbone: a model is quantized or
     * 16-bit as a whole (a dequantised copy is f32 throughout). */
    return m->cfg.n_layers > 0 && m->layers[0].wq.dtype == DTYPE_F32 ? DTYPE_F32 : DTYPE_F16;
}

int gen_kv_dtype_parse(const char *name, int *choice)
{
    for (int i = 0; gen_kv_dtype_names[i]; i++)
        if (strcmp(name, gen_kv_dtype_names[i]) == 0) {
            *choice = i;
            return 0;
        }
    return river_err_set(RIVER_EINVAL, "kv.dtype %s: expected auto, f32, f16, bf16 or q8",
                         name);
}

int gen_new(gen_t **out, const model_t *m, const tokenizer_t *tok, backend_t *be,
            const gen_config_t *cfg)
{
    gen_config_t c = *cfg;
    if (c.max_rows <= 0 || c.max_seqs <= 0 || c.page_size <= 0 || c.prefill_chunk <= 0)
        return river_err_set(RIVER_EINVAL, "generate: bad config (rows %d, seqs %d, page %d, "
                             "chunk %d)", c.max_rows, c.max_seqs, c.page_size, c.prefill_chunk);
    int kvd = m->cfg.n_kv_heads * m->cfg.head_dim;
    if (c.kv_dtype < GEN_KV_AUTO || c.kv_dtype >= GEN_KV_COUNT)
        return river_err_set(RIVER_EINVAL, "generate: kv.dtype choice %d", c.kv_dtype);
    dtype_t kv_dt = gen_kv_dtype(m, c.kv_dtype);
    if (c.kv_pool) {
        dtype_t have = kv_pool_dtype(c.kv_pool);
        if (c.kv_dtype != GEN_KV_AUTO && have != kv_dt)
            return river_err_set(RIVER_EINVAL, "generate: kv.dtype %s, but the KV pool given "
                                 "holds %s", dtype_name(kv_dt), dtype_name(have));
        kv_dt = have;
    }
    int e = kv_dtype_check(kv_dt, m->cfg.head_dim);
    if (e)
        return e;
    if (c.kv_pool) {
        const kv_view_t *v = kv_pool_view(c.kv_pool);
        if (kv_pool_n_layers(c.kv_pool) != m->cfg.n_layers || v->kv_dim != kvd ||
            v->page_size != c.page_size || kv_pool_is_attached(c.kv_pool))
            return river_err_set(RIVER_EINVAL, "generate: the KV pool given (%d layers, "
                                 "kv_dim %d, page %d%s) does not fit the model (%d layers, "
                                 "kv_dim %d, page %d)", kv_pool_n_layers(c.kv_pool),
                                 v->kv_dim, v->page_size,
                                 kv_pool_is_attached(c.kv_pool) ? ", attached" : "",
                                 m->cfg.n_layers, kvd, c.page_size);
        c.n_pages = kv_pool_total_pages(c.kv_pool);
    }
    if (c.n_pages <= 0)
        c.n_pages = c.max_seqs * ((m->cfg.max_seq_len + c.page_size - 1) / c.page_size);
    gen_t *g = calloc(1, sizeof *g);
    if (!g)
        return river_err_set(RIVER_ENOMEM, "generate: state");
    g->m = m;
    g->tok = tok;
    g->be = be;
    g->cfg = c;
    e = forward_new(&g->fwd, m, be, c.max_rows);
    if (e)
        goto fail_fwd;
    if (c.kv_pool) {
        g->kv = c.kv_pool;
    } else {
        e = kv_pool_new(&g->kv, be, m->cfg.n_layers, kvd, kv_dt, c.page_size, c.n_pages);
        if (e)
            goto fail_kv;
        g->owns_kv = 1;
        if (c.prefix_cache) {
            prefix_cache_config_t pcc = {.seed = c.prefix_seed,
                                         .key = c.prefix_key,
                                         .max_pages = c.prefix_cache_pages};
            if ((e = prefix_cache_new(&g->pc, g->kv, &pcc)))
                goto fail_pc;
            g->pc_on = 1;
        }
    }
    size_t r = (size_t)c.max_rows;
    g->seqs = calloc((size_t)c.max_seqs, sizeof *g->seqs);
    g->order = malloc((size_t)c.max_seqs * sizeof *g->order);
    g->tokens = malloc(r * sizeof *g->tokens);
    g->pos = malloc(r * sizeof *g->pos);
    g->logit_rows = malloc(r * sizeof *g->logit_rows);
    g->row_seq = malloc(r * sizeof *g->row_seq);
    g->tables = malloc(r * sizeof *g->tables);
    g->group = malloc(r * sizeof *g->group);
    g->depth = malloc(r * sizeof *g->depth);
    g->exit_seqs = malloc(r * sizeof *g->exit_seqs);
    g->row_exit = malloc(r * sizeof *g->row_exit);
    g->logits = malloc(r * (size_t)m->cfg.vocab_size * sizeof *g->logits);
    g->row_kind = malloc(r);
    g->row_logit = malloc(r * sizeof *g->row_logit);
    g->probs = malloc((size_t)m->cfg.vocab_size * sizeof *g->probs);
    g->start_layer = malloc(r * sizeof *g->start_layer);
    g->save_layer = malloc(r * sizeof *g->save_layer);
    g->start_hidden = malloc(r * (size_t)m->cfg.dim * sizeof *g->start_hidden);
    g->saved_hidden = malloc(r * (size_t)m->cfg.dim * sizeof *g->saved_hidden);
    g->spec = (gen_spec_t){.k_max = 4, .min_conf = 0, .ngram_min = 1, .ngram_max = 3};
    g->k_now = g->spec.k_max;
    if (!g->seqs || !g->order || !g->tokens || !g->pos || !g->logit_rows || !g->row_seq ||
        !g->tables || !g->group || !g->depth || !g->exit_seqs || !g->row_exit || !g->logits ||
        !g->row_kind || !g->row_logit || !g->probs || !g->start_layer || !g->save_layer ||
        !g->start_hidden || !g->saved_hidden) {
        e = river_err_set(RIVER_ENOMEM, "generate: batch of %d rows", c.max_rows);
        goto fail_bufs;
    }
    *out = g;
    return 0;

fail_bufs:
    free(g->order);
    free(g->group);
    free(g->depth);
    free(g->exit_seqs);
    free(g->row_exit);
    free(g->seqs);
    free(g->tokens);
    free(g->pos);
    free(g->logit_rows);
    free(g->row_seq);
    free(g->tables);
    free(g->logits);
    free(g->row_kind);
    free(g->row_logit);
    free(g->probs);
    free(g->start_layer);
    free(g->save_layer);
    free(g->start_hidden);
    free(g->saved_hidden);
    prefix_cache_destroy(&g->pc);
fail_pc:
    if (g->owns_kv)
        kv_pool_destroy(&g->kv);
fail_kv:
    forward_destroy(&g->fwd);
fail_fwd:
    free(g);
    return e;
}

/* Gives back the pages of s: its references to cached pages, its own pages. */
static void gen__kv_release(gen_t *g, gseq_t *s)
{
    if (g->pc)
        prefix_cache_release(g->pc, &s->kv, &s->px);
    else
        kv_seq_free(&s->kv, g->kv);
}

static void gen__release(gen_t *g, gseq_t *s)
{
    gen__kv_release(g, s);
    prefix_seq_free(&s->px);
    exit_seq_free(&s->exit);
    sampler_destroy(&s->sampler);
    tok_stream_destroy(&s->stream);
    grammar_state_destroy(&s->gram);
    grammar_state_destroy(&s->gram_draft);
    free(s->ids);
    free(s->pending);
    free(s->q);
    free(s->h);
    memset(s, 0, sizeof *s);
    g->n_active--;
}

void gen_destroy(gen_t **gp)
{
    gen_t *g = *gp;
    if (!g)
        return;
    for (int i = 0; i < g->cfg.max_seqs; i++)
        if (g->seqs[i].used)
            gen__release(g, &g->seqs[i]);
    free(g->seqs);
    free(g->order);
    free(g->tokens);
    free(g->pos);
    free(g->logit_rows);
    free(g->row_seq);
    free(g->tables);
    free(g->group);
    free(g->depth);
    free(g->exit_seqs);
    free(g->row_exit);
    free(g->logits);
    free(g->row_kind);
    free(g->row_logit);
    free(g->probs);
    free(g->start_layer);
    free(g->save_layer);
    free(g->start_hidden);
    free(g->saved_hidden);
    grammar_vocab_destroy(&g->gvocab);
    free(g->allowed);
    prefix_cache_destroy(&g->pc);
    if (g->owns_kv)
        kv_pool_destroy(&g->kv);
    forward_destroy(&g->fwd);
    free(g);
    *gp = NULL;
}

static int gen__pending_add(gseq_t *s, const char *text, size_t len);
static size_t gen__held_back(const gseq_t *s);

/* Appends an id to the sequence's history. */
static int gen__push_id(gseq_t *s, int32_t id)
{
    if (s->n_ids == s->cap_ids) {
        size_t cap = s->cap_ids ? s->cap_ids * 2 : 64;
        int32_t *p = realloc(s->ids, cap * sizeof *p);
        if (!p)
            return river_err_set(RIVER_ENOMEM, "generate: %zu ids", cap);
        s->ids = p;
        s->cap_ids = cap;
    }
    s->ids[s->n_ids++] = id;
    return 0;
}

/* Runs the done ids of a continued completion through the text stream and the stop-string
 * hold-back exactly as gen__accept would have, dropping the text instead of reporting it:
 * what stays pending is what the first run held back when it had reached that token. */
static int gen__prime_text(gseq_t *s, const int32_t *done, size_t n_done)
{
    for (size_t i = 0; i < n_done && s->stream; i++) {
        const char *piece;
        size_t len;
        int e = tok_stream_push(s->stream, done[i], &piece, &len);
        if (e || (e = gen__pending_add(s, piece, len)))
            return e;
        size_t hold = gen__held_back(s);
        memmove(s->pending, s->pending + s->n_pending - hold, hold);
        s->n_pending = hold;
    }
    return 0;
}

int gen_grammar_vocab(gen_t *g, const grammar_vocab_t **out)
{
    if (!g->gvocab) {
        int e = logits_vocab_new(&g->gvocab, g->tok, &g->m->cfg);
        if (e)
            return e;
    }
    *out = g->gvocab;
    return 0;
}

static int gen__is_eos(const gen_t *g, int32_t id)
{
    for (int i = 0; i < g->m->cfg.n_eos; i++)
        if (id == g->m->cfg.eos_ids[i])
            return 1;
    return 0;
}

/* The grammar states of a new sequence, with the ids a continued completion already has
 * run through them. */
static int gen__grammar_start(gen_t *g, gseq_t *s, const gen_request_t *r)
{
    int e = grammar_state_new(&s->gram, r->grammar);
    if (!e && s->lossless)
        e = grammar_state_new(&s->gram_draft, r->grammar);
    for (size_t i = 0; !e && i < r->n_done; i++)
        if (!gen__is_eos(g, r->done[i]) && grammar_state_accept(s->gram, r->done[i]))
            e = river_err_set(RIVER_EINVAL, "generate: done id %d (the %zu-th) breaks the "
                              "request's grammar", r->done[i], i + 1);
    return e;
}

/* Masks a row that s samples from with a grammar state (NULL: none). A grammar that allows
 * no token at all is the sequence's error. */
static int gen__constrain(gen_t *g, grammar_state_t *st, float *row)
{
    if (!st)
        return 0;
    int left = logits_mask(st, g->m->cfg.vocab_size, g->allowed, row);
    if (left == 0)
        return river_err_set(RIVER_EINVAL, "generate: the grammar allows no token of the "
                             "model's vocabulary here");
    return left < 0 ? left : 0;
}

/* Keeps the log-probabilities of id in row for the event that reports it, when asked. */
static void gen__logprob(const gen_t *g, gseq_t *s, const float *row, int32_t id)
{
    if (s->req.logprobs)
        logits_logprob(row, g->m->cfg.vocab_size, id, s->req.top_logprobs, &s->lp);
}

int gen_submit(gen_t *g, const gen_request_t *r, int *seq)
{
    if (r->n_prompt == 0)
        return river_err_set(RIVER_EINVAL, "generate: empty prompt");
    if (r->n_done && !r->done)
        return river_err_set(RIVER_EINVAL, "generate: %zu done ids and no array", r->n_done);
    size_t n_all = r->n_prompt + r->n_done;
    if (n_all >= (size_t)g->m->cfg.max_seq_len)
        return river_err_set(RIVER_EINVAL, "generate: prompt of %zu tokens does not fit the "
                             "context of %d", n_all, g->m->cfg.max_seq_len);
    if (r->max_tokens <= 0)
        return river_err_set(RIVER_EINVAL, "generate: max_tokens %d must be positive",
                             r->max_tokens);
    if (r->n_done >= (size_t)r->max_tokens)
        return river_err_set(RIVER_EINVAL, "generate: %zu tokens done of max_tokens %d: "
                             "nothing left to generate", r->n_done, r->max_tokens);
    for (size_t i = 0; i < n_all; i++) {
        int32_t id = i < r->n_prompt ? r->prompt[i] : r->done[i - r->n_prompt];
        if (id < 0 || id >= g->m->cfg.vocab_size)
            return river_err_set(RIVER_ERANGE, "generate: %s id %d outside vocab %d",
                                 i < r->n_prompt ? "prompt" : "done", id,
                                 g->m->cfg.vocab_size);
    }
    if (r->n_stop > 0 && !g->tok)
        return river_err_set(RIVER_EINVAL, "generate: stop strings need a tokenizer");
    if (r->top_logprobs < 0 || r->top_logprobs > LOGITS_TOP_MAX)
        return river_err_set(RIVER_EINVAL, "generate: top_logprobs %d outside 0..%d",
                             r->top_logprobs, LOGITS_TOP_MAX);
    if (r->grammar && !g->allowed) {
        size_t words = ((size_t)g->m->cfg.vocab_size + 31) / 32;
        if (!(g->allowed = malloc(words * sizeof *g->allowed)))
            return river_err_set(RIVER_ENOMEM, "generate: grammar mask");
    }
    int k_cap = 0;
    if (r->lossless) {
        if (!g->has_exit)
            return river_err_set(RIVER_EINVAL, "generate: lossless mode drafts on the exit "
                                 "path, and no exit policy is set");
        if (g->policy.kv != EXIT_KV_RIVER)
            return river_err_set(RIVER_EINVAL, "generate: lossless mode needs the river KV "
                                 "strategy (the draft must write every KV slot), not %s",
                                 exit_kv_name(g->policy.kv));
        if (r->draft_k < 0 || r->draft_k > GEN_DRAFT_MAX)
            return river_err_set(RIVER_EINVAL, "generate: draft length %d outside 1..%d",
                                 r->draft_k, GEN_DRAFT_MAX);
        if (g->cfg.max_rows < 2)
            return river_err_set(RIVER_EINVAL, "generate: lossless mode needs batches of 2 "
                                 "rows or more (max_rows %d)", g->cfg.max_rows);
        k_cap = r->draft_k ? r->draft_k : g->spec.k_max;
        if (k_cap > g->cfg.max_rows - 1)
            k_cap = g->cfg.max_rows - 1;
    }
    gseq_t *s = NULL;
    for (int i = 0; i < g->cfg.max_seqs && !s; i++)
        if (!g->seqs[i].used)
            s = &g->seqs[i];
    if (!s)
        return river_err_set(RIVER_EFULL, "generate: %d sequences already running",
                             g->cfg.max_seqs);
    int e = sampler_new(&s->sampler, &r->sampling, g->m->cfg.vocab_size);
    if (e)
        return e;
    s->lossless = r->lossless != 0;
    s->k_cap = k_cap;
    if (s->lossless) {
        s->h = malloc((size_t)k_cap * (size_t)g->m->cfg.dim * sizeof *s->h);
        if (!s->h) {
            e = river_err_set(RIVER_ENOMEM, "generate: draft residual streams");
            goto fail;
        }
    }
    if (s->lossless && !sampler_is_greedy(s->sampler)) {
        s->q = malloc((size_t)k_cap * (size_t)g->m->cfg.vocab_size * sizeof *s->q);
        if (!s->q) {
            e = river_err_set(RIVER_ENOMEM, "generate: draft distributions");
            goto fail;
        }
    }
    if (g->tok && (e = tok_stream_new(&s->stream, g->tok, 1)))
        goto fail;
    if (r->grammar && (e = gen__grammar_start(g, s, r)))
        goto fail;
    s->cap_ids = n_all + 64;
    s->ids = malloc(s->cap_ids * sizeof *s->ids);
    if (!s->ids) {
        e = river_err_set(RIVER_ENOMEM, "generate: prompt copy");
        goto fail;
    }
    memcpy(s->ids, r->prompt, r->n_prompt * sizeof *s->ids);
    if (r->n_done)
        memcpy(s->ids + r->n_prompt, r->done, r->n_done * sizeof *s->ids);
    s->n_ids = n_all;
    s->n_prompt = n_all;
    s->req = *r;
    s->req.prompt = NULL;
    s->req.done = NULL;
    if (r->n_done) {
        if ((e = gen__prime_text(s, r->done, r->n_done)))
            goto fail;
        sampler_skip(s->sampler, r->n_done);
        s->n_generated = (int)r->n_done;
    }
    kv_seq_init(&s->kv);
    prefix_seq_init(&s->px, g->pc);
    if (g->pc && r->n_prefix_salt)
        prefix_seq_set_salt(&s->px, g->pc, r->prefix_salt, r->n_prefix_salt);
    s->req.prefix_salt = NULL;
    s->req.n_prefix_salt = 0;
    exit_seq_init(&s->exit);
    if (r->exit) {
        s->row_exit = *r->exit;
        s->has_row_exit = 1;
    }
    s->req.exit = NULL; /* copied: the caller's struct need not outlive the call */
    s->used = 1;
    s->id = g->next_id++;
    g->n_active++;
    *seq = s->id;
    return 0;

fail:
    tok_stream_destroy(&s->stream);
    grammar_state_destroy(&s->gram);
    grammar_state_destroy(&s->gram_draft);
    sampler_destroy(&s->sampler);
    free(s->ids);
    free(s->pending);
    free(s->q);
    free(s->h);
    memset(s, 0, sizeof *s);
    return e;
}

static gseq_t *gen__find(gen_t *g, int seq)
{
    for (int i = 0; i < g->cfg.max_seqs; i++)
        if (g->seqs[i].used && g->seqs[i].id == seq)
            return &g->seqs[i];
    return NULL;
}

static int gen__pending_add(gseq_t *s, const char *text, size_t len)
{
    if (s->n_pending + len + 1 > s->cap_pending) {
        size_t cap = s->cap_pending ? s->cap_pending : 64;
        while (cap < s->n_pending + len + 1)
            cap *= 2;
        char *p = realloc(s->pending, cap);
        if (!p)
            return river_err_set(RIVER_ENOMEM, "generate: text buffer");
        s->pending = p;
        s->cap_pending = cap;
    }
    memcpy(s->pending + s->n_pending, text, len);
    s->n_pending += len;
    s->pending[s->n_pending] = '\0';
    return 0;
}

/* Length of the longest tail of pending text that could still grow into a stop string:
 * that much is held back, the rest is final. */
static size_t gen__held_back(const gseq_t *s)
{
    size_t hold = 0;
    for (int k = 0; k < s->req.n_stop; k++) {
        size_t sl = strlen(s->req.stop[k]);
        for (size_t t = sl > 1 ? sl - 1 : 0; t > hold; t--)
            if (t <= s->n_pending &&
                !memcmp(s->pending + s->n_pending - t, s->req.stop[k], t)) {
                hold = t;
                break;
            }
    }
    return hold;
}

/* Reports the sequence's end to its owner and frees it. */
static void gen__finish(gen_t *g, gseq_t *s, int32_t id, int depth, gen_finish_t why)
{
    if (s->stream && why != GEN_FINISH_STOP) {
        const char *piece;
        size_t len;
        if (tok_stream_finish(s->stream, &piece, &len) == 0)
            gen__pending_add(s, piece, len);
    }
    gen_event_t ev = {.seq = s->id, .id = id, .text = s->pending ? s->pending : "",
                      .len = s->n_pending, .finish = why, .depth = depth,
                      .index = id >= 0 ? s->n_generated - 1 : s->n_generated,
                      .err = why == GEN_FINISH_ERROR ? (s->err ? s->err : RIVER_EIO) : 0,
                      .cached_tokens = s->cached_tokens,
                      .drafted = s->drafted, .accepted = s->accepted, .drafts = s->drafts,
                      .logprob = id >= 0 && s->req.logprobs ? &s->lp : NULL};
    if (s->req.on_token)
        s->req.on_token(s->req.user, &ev);
    gen__release(g, s);
}

int gen_cancel(gen_t *g, int seq)
{
    gseq_t *s = gen__find(g, seq);
    if (!s)
        return river_err_set(RIVER_ENOTFOUND, "generate: no running sequence %d", seq);
    s->n_pending = 0;
    gen__finish(g, s, -1, 0, GEN_FINISH_CANCEL);
    return 0;
}

/* Handles one sampled id: EOS, text, stop strings, length and context limits. */
static void gen__accept(gen_t *g, gseq_t *s, int32_t id, int depth)
{
    const model_config_t *c = &g->m->cfg;
    s->n_generated++;
    s->last = id;
    /* The history is what a preempted sequence prefills again. */
    if ((s->err = gen__push_id(s, id))) {
        gen__finish(g, s, id, depth, GEN_FINISH_ERROR);
        return;
    }
    if (!s->req.ignore_eos && gen__is_eos(g, id)) {
        gen__finish(g, s, id, depth, GEN_FINISH_EOS);
        return;
    }
    /* The mask let only ids through that the grammar takes. */
    if (s->gram && !gen__is_eos(g, id) && (s->err = grammar_state_accept(s->gram, id))) {
        gen__finish(g, s, id, depth, GEN_FINISH_ERROR);
        return;
    }
    if (s->stream) {
        const char *piece;
        size_t len;
        if ((s->err = tok_stream_push(s->stream, id, &piece, &len)) ||
            (s->err = gen__pending_add(s, piece, len))) {
            gen__finish(g, s, id, depth, GEN_FINISH_ERROR);
            return;
        }
        for (int k = 0; k < s->req.n_stop; k++) {
            const char *hit = s->n_pending ? strstr(s->pending, s->req.stop[k]) : NULL;
            if (hit && s->req.stop[k][0]) {
                s->n_pending = (size_t)(hit - s->pending);
                gen__finish(g, s, id, depth, GEN_FINISH_STOP);
                return;
            }
        }
    }
    if (s->n_generated >= s->req.max_tokens) {
        gen__finish(g, s, id, depth, GEN_FINISH_LENGTH);
        return;
    }
    if (s->pos >= c->max_seq_len) {
        gen__finish(g, s, id, depth, GEN_FINISH_CONTEXT);
        return;
    }
    size_t hold = gen__held_back(s);
    size_t emit = s->n_pending - hold;
    gen_event_t ev = {.seq = s->id, .id = id, .text = s->pending ? s->pending : "",
                      .len = emit, .finish = GEN_RUNNING, .depth = depth,
                      .index = s->n_generated - 1, .cached_tokens = s->cached_tokens,
                      .drafted = s->drafted, .accepted = s->accepted, .drafts = s->drafts,
                      .logprob = s->req.logprobs ? &s->lp : NULL};
    if (s->req.on_token)
        s->req.on_token(s->req.user, &ev);
    if (hold) /* without a tokenizer pending is NULL, and memmove must not see it */
        memmove(s->pending, s->pending + emit, hold);
    s->n_pending = hold;
}

/* Fills g->order with the slots of live sequences, oldest first (ids grow with age), and
 * returns how many. Older sequences get rows and pages first, so under preemption the
 * work done longest ago is the last to be thrown away. */
static int gen__order(gen_t *g)
{
    int n = 0;
    for (int i = 0; i < g->cfg.max_seqs; i++) {
        if (!g->seqs[i].used)
            continue;
        int j = n++;
        while (j > 0 && g->seqs[g->order[j - 1]].id > g->seqs[i].id) {
            g->order[j] = g->order[j - 1];
            j--;
        }
        g->order[j] = i;
    }
    return n;
}

static int gen__pages_for(const gen_t *g, size_t n_pos)
{
    return (int)((n_pos + (size_t)g->cfg.page_size - 1) / (size_t)g->cfg.page_size);
}

/* Pages a sequence could get now: free ones and cached ones nobody references. */
static int gen__pages_avail(const gen_t *g)
{
    return kv_pool_free_pages(g->kv) + (g->pc ? prefix_cache_evictable(g->pc) : 0);
}

/* Whether s must get the plain backbone's K/V: no exit policy, or its request said none. */
static int gen__exact(const gen_t *g, const gseq_t *s)
{
    return !g->exit_on || g->policy.rule == EXIT_RULE_NONE ||
           (s->has_row_exit && s->row_exit.off);
}

/* A sequence about to prefill from position 0 starts from the longest cached prefix of
 * its ids, at most all but the last (whose logits are needed). */
static void gen__lookup(gen_t *g, gseq_t *s)
{
    size_t hit = 0;
    if (prefix_cache_acquire(g->pc, &s->kv, &s->px, s->ids, s->n_prompt, s->n_prompt - 1,
                             gen__exact(g, s), &hit))
        hit = 0; /* out of memory: the sequence prefills everything */
    s->n_prefilled = hit;
    if (!s->looked_up) {
        s->looked_up = 1;
        s->cached_tokens = (int)hit;
        g->stats.prefix_query_tokens += (int64_t)s->n_prompt;
        g->stats.prefix_hit_tokens += (int64_t)hit;
    }
}

/* Gives every page of s back and rewinds it to prefill its prompt and all it generated
 * (the last sampled id included, so the prefill's last row samples the next token, as the
 * decode row would have). Sampler, text stream and counters stay: nothing is reported
 * twice. The exit state of the baseline strategies starts over with the KV. */
static void gen__preempt(gen_t *g, gseq_t *s)
{
    gen__kv_release(g, s);
    exit_seq_free(&s->exit);
    exit_seq_init(&s->exit);
    s->n_prompt = s->n_ids;
    s->n_prefilled = 0;
    s->pos = 0;
    s->swapped = 1;
    s->mark = g->n_steps; /* it does not start over in the batch that preempted it */
    s->n_draft = 0;       /* the draft is dropped; the round starts over after prefill */
    s->verifying = 0;
    s->draft_ngram = 0;
    g->stats.preemptions++;
}

/* Reserves pages for positions 0..n_pos-1 of s. Returns 0 when s has them, 1 when s was
 * preempted and waits, -1 when s ended (GEN_FINISH_ERROR). Without preemption a full pool
 * ends s; with it, younger sequences that have no rows in this batch give their pages
 * back first, youngest first, and s itself when none is left. */
static int gen__reserve(gen_t *g, gseq_t *s, size_t n_pos)
{
    while (kv_seq_reserve(&s->kv, g->kv, (int)n_pos) != 0) {
        /* Cached pages nobody uses go first: the cache never costs a running sequence
         * its pages. */
        int short_by = gen__pages_for(g, n_pos) - s->kv.n_pages - kv_pool_free_pages(g->kv);
        if (g->pc && short_by > 0 && prefix_cache_evict(g->pc, short_by) > 0)
            continue;
        if (!g->cfg.preempt) {
            s->err = river_err_set(RIVER_EFULL, "generate: no free KV page for sequence %d",
                                   s->id);
            gen__finish(g, s, -1, 0, GEN_FINISH_ERROR);
            return -1;
        }
        if (gen__pages_for(g, n_pos) > kv_pool_total_pages(g->kv)) {
            river_err_set(RIVER_EFULL, "generate: sequence %d needs %d KV pages, the pool has "
                          "%d", s->id, gen__pages_for(g, n_pos), kv_pool_total_pages(g->kv));
            s->err = RIVER_EFULL;
            gen__finish(g, s, -1, 0, GEN_FINISH_ERROR);
            return -1;
        }
        gseq_t *victim = NULL;
        for (int i = 0; i < g->cfg.max_seqs; i++) {
            gseq_t *c = &g->seqs[i];
            if (c->used && c->id > s->id && c->kv.n_pages > 0 && c->mark != g->n_steps &&
                (!victim || c->id > victim->id))
                victim = c;
        }
        if (!victim) {
            gen__preempt(g, s);
            return 1;
        }
        gen__preempt(g, victim);
    }
    return 0;
}

/* A row's exit thresholds: its request's, or the policy's. */
static exit_row_t gen__row_exit(const gen_t *g, const gseq_t *s)
{
    if (s->has_row_exit)
        return s->row_exit;
    return (exit_row_t){.tau = g->policy.tau, .theta = g->policy.theta,
                        .exit_layer = g->policy.exit_layer};
}

/* The draft length the cost model predicts fastest now: measured step times, the
 * acceptance rate seen so far, the draft step time seen in serving. */
static void gen__spec_pick(gen_t *g)
{
    if (!g->spec.costs)
        return;
    const gen_stats_t *st = &g->stats;
    double alpha = st->spec_draft_tokens >= 16
                       ? (double)st->spec_accepted_tokens / (double)st->spec_draft_tokens
                       : 0.9;
    double t_draft = st->draft_steps >= 8 ? st->draft_s / (double)st->draft_steps
                                          : g->costs.t_draft;
    int k_max = g->costs.k_max < g->spec.k_max ? g->costs.k_max : g->spec.k_max;
    g->k_now = spec_pick_k(alpha, k_max, g->costs.t_plain, t_draft, g->costs.t_verify, NULL);
}

/* Draft tokens s may still add this round: its cap, and no more than the completion and
 * the context leave room for (the verify pass adds one id of its own). */
static int gen__draft_limit(const gen_t *g, const gseq_t *s)
{
    int lim = s->k_cap;
    if (!s->req.draft_k && g->k_now < lim) /* the request's own k is not the pick's */
        lim = g->k_now;
    int left = s->req.max_tokens - s->n_generated - 1;
    int room = g->m->cfg.max_seq_len - 1 - s->pos;
    lim = left < lim ? left : lim;
    lim = room < lim ? room : lim;
    return lim > 0 ? lim : 0;
}

/* Takes one draft id from the draft row's logits: the argmax (greedy) or a draw from the
 * sampler's distribution, which is kept for the rejection rule. The draft ends at its
 * limit, at an end-of-sequence id, or after a token the draft is not confident of. */
static void gen__draft(gen_t *g, gseq_t *s, float *lg)
{
    const model_config_t *c = &g->m->cfg;
    int32_t id;
    float conf;
    /* The draft follows the grammar as the verified ids will: a draft id the mask of the
     * backbone would refuse could never be accepted. A stuck grammar ends the draft. */
    if (gen__constrain(g, s->gram_draft, lg)) {
        s->verifying = 1;
        return;
    }
    if (s->q) {
        float *q = s->q + (size_t)s->n_draft * (size_t)c->vocab_size;
        sampler_probs(s->sampler, lg, q);
        id = sampler_pick(s->sampler, q);
        conf = q[sampler_argmax(q, c->vocab_size)];
    } else {
        id = sampler_argmax(lg, c->vocab_size);
        double sum = 0;
        for (int i = 0; i < c->vocab_size; i++)
            sum += exp((double)(lg[i] - lg[id]));
        conf = (float)(1.0 / sum);
    }
    s->draft[s->n_draft++] = id;
    /* gen__draft_limit counts from pos, which stays put while the draft grows. */
    int stop = s->n_draft >= gen__draft_limit(g, s) || conf < g->spec.min_conf;
    for (int i = 0; i < c->n_eos && !s->req.ignore_eos; i++)
        stop |= id == c->eos_ids[i];
    if (s->gram_draft && !gen__is_eos(g, id))
        stop |= grammar_state_accept(s->gram_draft, id) != 0;
    if (stop)
        s->verifying = 1;
}

/* The cost model's choice between a river draft and an n-gram draft of m ids: the expected
 * ids per second of each (spec_speedup) at the acceptance each source has had so far (0.9
 * for the river and 0.5 for the lookup until 16 of its tokens were verified); an n-gram
 * draft runs no draft step. The step times are the measured costs where the generator has
 * them, else a draft step at half a verify pass: not the times seen in serving, so that
 * the same ids make the same choices on a loaded machine. */
static int gen__ngram_pays(const gen_t *g, int m, int k)
{
    const gen_stats_t *st = &g->stats;
    int64_t nd = st->spec_ngram_draft_tokens, rd = st->spec_draft_tokens - nd;
    double a_ngram = nd >= 16 ? (double)st->spec_ngram_accepted_tokens / (double)nd : 0.5;
    double a_river = rd >= 16 ? (double)(st->spec_accepted_tokens -
                                         st->spec_ngram_accepted_tokens) / (double)rd
                              : 0.9;
    double t_draft = 0.5, t_vk = 1, t_vm = 1;
    if (g->spec.costs) {
        int kc = k < g->costs.k_max ? k : g->costs.k_max;
        int mc = m < g->costs.k_max ? m : g->costs.k_max;
        t_draft = g->costs.t_draft;
        t_vk = g->costs.t_verify[kc];
        t_vm = g->costs.t_verify[mc];
    }
    return spec_speedup(a_ngram, m, 1, 0, t_vm) >= spec_speedup(a_river, k, 1, t_draft, t_vk);
}

/* The start of a lossless round: nothing left to draft verifies at once (one backbone
 * row); an n-gram source looks the sequence's history up and, where it takes the lookup's
 * draft, goes straight to verifying it. Sampling keeps the draft's distribution, a point
 * mass on each looked-up id, for the rejection rule. */
static void gen__round_start(gen_t *g, gseq_t *s)
{
    int lim = gen__draft_limit(g, s);
    /* Without a copy of the grammar's state to draft under there is no draft: the round
     * verifies at once. */
    if (lim == 0 || (s->gram_draft && grammar_state_copy(s->gram_draft, s->gram))) {
        s->verifying = 1;
        return;
    }
    if (g->spec.source == GEN_DRAFT_RIVER)
        return;
    int m = spec_ngram_draft(s->ids, s->n_ids, g->spec.ngram_min, g->spec.ngram_max, lim,
                             s->draft);
    const model_config_t *c = &g->m->cfg;
    for (int j = 0; j < m && !s->req.ignore_eos; j++)
        for (int i = 0; i < c->n_eos; i++)
            if (s->draft[j] == c->eos_ids[i])
                m = j + 1; /* nothing is drafted past an end of sequence */
    /* A looked-up id the grammar refuses ends the draft there: it could not be accepted. */
    for (int j = 0; j < m && s->gram_draft; j++)
        if (gen__is_eos(g, s->draft[j]) ? !grammar_state_can_end(s->gram_draft)
                                        : grammar_state_accept(s->gram_draft, s->draft[j]) != 0)
            m = j;
    if (g->spec.source == GEN_DRAFT_BOTH && (m == 0 || !gen__ngram_pays(g, m, lim))) {
        if (s->gram_draft && grammar_state_copy(s->gram_draft, s->gram))
            s->verifying = 1; /* the river's draft needs the state back */
        return;
    }
    s->n_draft = m;
    s->draft_ngram = 1;
    s->verifying = 1;
    for (int j = 0; j < m && s->q; j++) {
        float *q = s->q + (size_t)j * (size_t)c->vocab_size;
        memset(q, 0, (size_t)c->vocab_size * sizeof *q);
        q[s->draft[j]] = 1;
    }
}

/* Verifies s's draft against the backbone's logits at its n_draft+1 verify rows (lg, one
 * row after another): accepts a prefix, adds the backbone's next id, and rolls the
 * rejected positions back. Returns the ids it emitted. */
static int gen__verify(gen_t *g, gseq_t *s, float *lg)
{
    const model_config_t *c = &g->m->cfg;
    size_t vocab = (size_t)c->vocab_size;
    int nd = s->n_draft, base = s->pos, id = s->id, emitted = 0;
    s->n_draft = 0;
    s->verifying = 0;
    g->stats.spec_verify_passes++;
    g->stats.spec_drafts += nd > 0;
    g->stats.spec_draft_tokens += nd;
    s->drafted += nd;
    s->drafts += nd > 0;
    int ngram = s->draft_ngram;
    s->draft_ngram = 0;
    g->stats.spec_ngram_drafts += ngram && nd > 0;
    g->stats.spec_ngram_draft_tokens += ngram ? nd : 0;
    for (int j = 0; j <= nd; j++) {
        float *row = lg + (size_t)j * vocab;
        int32_t tok;
        int ok = 0;
        /* The backbone's distribution under the grammar's mask at this position: the one
         * the constrained output must follow. */
        if ((s->err = gen__constrain(g, s->gram, row))) {
            gen__finish(g, s, -1, c->n_layers, GEN_FINISH_ERROR);
            return emitted;
        }
        if (!s->q) {
            tok = sampler_argmax(row, c->vocab_size);
            ok = j < nd && s->draft[j] == tok;
        } else {
            sampler_probs(s->sampler, row, g->probs);
            if (j < nd) {
                const float *q = s->q + (size_t)j * vocab;
                int32_t x = s->draft[j];
                /* Accept x with probability min(1, p(x)/q(x)); q(x) > 0 since x was drawn
                 * from q. */
                ok = (double)sampler_uniform(s->sampler) * q[x] < g->probs[x];
                if (!ok)
                    for (size_t i = 0; i < vocab; i++) {
                        float d = g->probs[i] - q[i];
                        g->probs[i] = d > 0 ? d : 0;
                    }
            }
            tok = ok ? s->draft[j] : sampler_pick(s->sampler, g->probs);
        }
        s->accepted += ok;
        g->stats.spec_accepted_tokens += ok;
        g->stats.spec_ngram_accepted_tokens += ngram && ok;
        /* The id fed at base+j has its backbone K/V now; the new id goes to base+j+1. */
        s->pos = base + j + 1;
        emitted++;
        gen__logprob(g, s, row, tok);
        gen__accept(g, s, tok, c->n_layers);
        if (!s->used || s->id != id)
            return emitted; /* finished */
        if (!ok)
            break;
    }
    /* Slots past pos hold rejected draft values, rewritten before anything reads them;
     * pages wholly past it go back. */
    kv_seq_truncate(&s->kv, g->kv, s->pos);
    gen__spec_pick(g);
    return emitted;
}

int gen_step(gen_t *g)
{
    int n = 0, n_logits = 0, n_prefill = 0;
    int budget = g->cfg.max_rows;
    int n_order = gen__order(g);
    /* Marks are step numbers; 0 never names a step, so a fresh sequence is in no batch. */
    if (++g->n_steps == 0)
        g->n_steps = 1;
    /* Running sequences first: one decode row each keeps their latency steady (a lossless
     * sequence: one draft row, or its k+1 verify rows). */
    int n_draft_rows = 0, n_verify_rows = 0;
    int L = g->m->cfg.n_layers;
    size_t dim = (size_t)g->m->cfg.dim;
    for (int k = 0; k < n_order && n < budget; k++) {
        gseq_t *s = &g->seqs[g->order[k]];
        if (!s->used || s->n_prefilled < s->n_prompt)
            continue;
        int kind = ROW_PLAIN, rows = 1;
        if (s->lossless) {
            if (!s->verifying && s->n_draft == 0)
                gen__round_start(g, s);
            kind = s->verifying ? ROW_VERIFY : ROW_DRAFT;
            rows = s->verifying ? s->n_draft + 1 : 1;
            if (rows > budget - n)
                continue; /* the verify rows wait for a batch with room */
        }
        size_t need = (size_t)s->pos + (size_t)(kind == ROW_DRAFT ? s->n_draft + 1 : rows);
        if (gen__reserve(g, s, need))
            continue;
        s->mark = g->n_steps;
        for (int j = 0; j < rows; j++) {
            int off = kind == ROW_DRAFT ? s->n_draft : j; /* position past pos */
            g->tokens[n] = off == 0 ? s->last : s->draft[off - 1];
            g->pos[n] = s->pos + off;
            g->tables[n] = s->kv.pages;
            g->row_seq[n] = g->order[k];
            /* Decode rows exit together under min aggregation, each on its own under row. */
            g->group[n] = g->agg == EXIT_AGG_ROW ? g->cfg.max_seqs + n : -1;
            g->exit_seqs[n] = &s->exit;
            g->row_exit[n] = gen__row_exit(g, s);
            if (kind == ROW_VERIFY) /* the backbone verifies: it never exits */
                g->row_exit[n] = (exit_row_t){.off = 1};
            g->row_kind[n] = (uint8_t)kind;
            g->start_layer[n] = 0;
            g->save_layer[n] = -1;
            if (kind == ROW_DRAFT) /* keep the stream where this row stops being exact */
                g->save_layer[n] = s->n_draft == 0 ? L : s->reuse[s->n_draft - 1];
            if (kind == ROW_VERIFY && j < s->n_draft && !g->spec.no_reuse && !s->draft_ngram) {
                g->start_layer[n] = s->reuse[j];
                memcpy(g->start_hidden + (size_t)n * dim, s->h + (size_t)j * dim,
                       dim * sizeof *s->h);
            }
            g->row_logit[n] = n_logits;
            g->logit_rows[n_logits++] = n;
            n++;
        }
        n_draft_rows += kind == ROW_DRAFT;
        n_verify_rows += kind == ROW_VERIFY ? rows : 0;
    }
    /* Then prompt chunks of sequences still in prefill, as far as the batch has room. A
     * preempted sequence waiting for pages blocks younger ones from starting, so that new
     * requests do not keep taking the pages it waits for. */
    int blocked = 0;
    for (int k = 0; k < n_order && n < budget; k++) {
        gseq_t *s = &g->seqs[g->order[k]];
        if (!s->used || s->n_prefilled >= s->n_prompt)
            continue;
        if (s->kv.n_pages == 0) {
            if (blocked)
                continue;
            if (s->swapped && (s->mark == g->n_steps ||
                               gen__pages_for(g, s->n_prompt) > gen__pages_avail(g))) {
                blocked = 1;
                continue;
            }
            if (g->pc_on && s->n_prefilled == 0)
                gen__lookup(g, s);
        }
        size_t left = s->n_prompt - s->n_prefilled;
        int chunk = (int)(left < (size_t)g->cfg.prefill_chunk ? left : (size_t)g->cfg.prefill_chunk);
        if (chunk > budget - n)
            chunk = budget - n;
        int r = gen__reserve(g, s, s->n_prefilled + (size_t)chunk);
        if (r) {
            blocked |= r > 0;
            continue;
        }
        s->swapped = 0;
        s->mark = g->n_steps;
        for (int j = 0; j < chunk; j++) {
            g->tokens[n] = s->ids[s->n_prefilled + (size_t)j];
            g->pos[n] = (int)s->n_prefilled + j;
            g->tables[n] = s->kv.pages;
            g->row_seq[n] = g->order[k];
            g->group[n] = g->order[k]; /* a prompt chunk exits as one (sequence-level exit) */
            g->exit_seqs[n] = &s->exit;
            g->row_exit[n] = gen__row_exit(g, s);
            if (s->lossless) /* the prompt's K/V and first id are the backbone's */
                g->row_exit[n] = (exit_row_t){.off = 1};
            g->row_kind[n] = ROW_PLAIN;
            g->start_layer[n] = 0;
            g->save_layer[n] = -1;
            g->row_logit[n] = -1;
            n++;
        }
        if ((size_t)chunk == left) {
            g->row_logit[n - 1] = n_logits;
            g->logit_rows[n_logits++] = n - 1;
        }
        n_prefill += chunk;
    }
    if (n == 0)
        return 0;

    double t0 = clock_now_s();
    fwd_batch_t b = {.n = n, .tokens = g->tokens, .pos = g->pos, .page_table = g->tables,
                     .n_logits = n_logits, .logit_rows = g->logit_rows, .group = g->group,
                     .exit_seq = g->exit_seqs, .depth = g->depth, .row_exit = g->row_exit,
                     /* Only lossless rows resume or keep streams: other batches leave the
                      * forward's per-layer bookkeeping of them out. */
                     .start_layer = n_verify_rows ? g->start_layer : NULL,
                     .start_hidden = g->start_hidden,
                     .save_layer = n_draft_rows ? g->save_layer : NULL,
                     .saved_hidden = g->saved_hidden};
    int e = forward_step(g->fwd, g->kv, &b, g->logits);
    double dt = clock_now_s() - t0;
    if (e) {
        for (int i = 0; i < g->cfg.max_seqs; i++)
            if (g->seqs[i].used) {
                g->seqs[i].err = e;
                gen__finish(g, &g->seqs[i], -1, 0, GEN_FINISH_ERROR);
            }
        return e;
    }
    if (n_prefill) {
        g->stats.prefill_s += dt;
        g->stats.prefill_tokens += n_prefill;
    } else {
        g->stats.decode_s += dt;
        if (n_verify_rows) {
            g->stats.verify_s += dt;
            g->stats.verify_steps++;
        } else if (n_draft_rows) {
            g->stats.draft_s += dt;
            g->stats.draft_steps++;
        }
    }
    /* Advance positions before sampling, which may finish and free a sequence. Lossless
     * decode rows move their sequence's position when the draft is verified. */
    for (int r = 0; r < n; r++) {
        gseq_t *s = &g->seqs[g->row_seq[r]];
        if (s->n_prefilled < s->n_prompt)
            s->n_prefilled++;
        else if (g->row_kind[r] == ROW_PLAIN)
            s->pos++;
        if (s->n_prefilled == s->n_prompt && s->pos < (int)s->n_prompt)
            s->pos = (int)s->n_prompt;
        if (g->pc_on && g->exit_on && g->depth[r] < g->m->cfg.n_layers)
            prefix_seq_mark_lossy(&s->px, g->pc, g->pos[r]);
    }
    /* Pages that are full now go to the cache before sampling can end their sequence. */
    for (int i = 0; g->pc_on && i < g->cfg.max_seqs; i++) {
        gseq_t *s = &g->seqs[i];
        if (s->used && s->kv.n_pages)
            prefix_cache_publish(g->pc, &s->kv, &s->px, s->ids,
                                 s->n_prefilled < s->n_prompt ? s->n_prefilled
                                                              : (size_t)s->pos);
    }
    int64_t emitted = 0;
    size_t vocab = (size_t)g->m->cfg.vocab_size;
    for (int r = 0; r < n; r++) {
        gseq_t *s = &g->seqs[g->row_seq[r]];
        if (g->row_logit[r] < 0 || !s->used)
            continue;
        float *lg = g->logits + (size_t)g->row_logit[r] * vocab;
        if (g->row_kind[r] == ROW_DRAFT) {
            int j = s->n_draft;
            int at = g->depth[r] < g->save_layer[r] ? g->depth[r] : g->save_layer[r];
            s->reuse[j] = at;
            memcpy(s->h + (size_t)j * dim, g->saved_hidden + (size_t)r * dim,
                   dim * sizeof *s->h);
            gen__draft(g, s, lg);
        } else if (g->row_kind[r] == ROW_VERIFY) {
            /* The sequence's verify rows are consecutive, its last accepted id first. */
            int rows = s->n_draft + 1;
            emitted += gen__verify(g, s, lg);
            r += rows - 1;
        } else {
            if ((s->err = gen__constrain(g, s->gram, lg))) {
                gen__finish(g, s, -1, g->depth[r], GEN_FINISH_ERROR);
                continue;
            }
            int32_t id = sampler_sample(s->sampler, lg);
            gen__logprob(g, s, lg, id);
            gen__accept(g, s, id, g->depth[r]);
            emitted++;
        }
    }
    if (!n_prefill)
        g->stats.decode_tokens += emitted;
    return 0;
}

int gen_active(const gen_t *g) { return g->n_active; }

int gen_set_spec(gen_t *g, const gen_spec_t *spec)
{
    if (spec->k_max < 1 || spec->k_max > GEN_DRAFT_MAX)
        return river_err_set(RIVER_EINVAL, "generate: draft length %d outside 1..%d",
                             spec->k_max, GEN_DRAFT_MAX);
    if (!(spec->min_conf >= 0 && spec->min_conf <= 1))
        return river_err_set(RIVER_EINVAL, "generate: draft confidence %g outside [0, 1]",
                             (double)spec->min_conf);
    gen_spec_t sp = *spec;
    if (!sp.ngram_min && !sp.ngram_max) {
        sp.ngram_min = 1;
        sp.ngram_max = 3;
    }
    if ((unsigned)sp.source > GEN_DRAFT_BOTH || sp.ngram_min < 1 ||
        sp.ngram_max < sp.ngram_min || sp.ngram_max > SPEC_NGRAM_MAX)
        return river_err_set(RIVER_EINVAL, "generate: draft source %d, n-gram lengths "
                             "%d..%d (the source is river, ngram or both; the lengths within "
                             "1..%d)", (int)sp.source, sp.ngram_min, sp.ngram_max,
                             SPEC_NGRAM_MAX);
    g->spec = sp;
    g->k_now = spec->k_max;
    if (spec->costs) {
        if (spec->costs->k_max < 1 || spec->costs->k_max > SPEC_K_MAX)
            return river_err_set(RIVER_EINVAL, "generate: costs measured up to k %d",
                                 spec->costs->k_max);
        g->costs = *spec->costs;
        g->spec.costs = &g->costs;
        gen__spec_pick(g);
    }
    return 0;
}

int gen_set_exit(gen_t *g, const exit_config_t *cfg)
{
    int e = forward_set_exit(g->fwd, cfg);
    if (e)
        return e;
    g->has_exit = cfg && cfg->policy.rule != EXIT_RULE_NONE;
    g->agg = cfg ? cfg->policy.agg : EXIT_AGG_MIN;
    if (cfg)
        g->policy = cfg->policy;
    g->exit_on = cfg != NULL;
    /* The other strategies keep exit state per sequence that a shared page lacks. */
    g->pc_on = g->pc && (!cfg || cfg->policy.rule == EXIT_RULE_NONE ||
                         cfg->policy.kv == EXIT_KV_RIVER);
    return 0;
}
int gen_seq_kv(gen_t *g, int seq, const int32_t **pages, int *n_pos)
{
    gseq_t *s = gen__find(g, seq);
    if (!s)
        return river_err_set(RIVER_ENOTFOUND, "generate: no running sequence %d", seq);
    *pages = s->kv.pages;
    *n_pos = s->n_prefilled < s->n_prompt ? (int)s->n_prefilled : s->pos;
    return 0;
}

kv_pool_t *gen_kv_pool(gen_t *g) { return g->kv; }
forward_t *gen_forward(gen_t *g) { return g->fwd; }
void gen_get_stats(const gen_t *g, gen_stats_t *st)
{
    *st = g->stats;
    st->spec_k = g->k_now;
    if (g->pc) {
        st->prefix_evictions = prefix_cache_evictions(g->pc);
        st->prefix_cache_pages = prefix_cache_pages(g->pc);
    }
}

const prefix_cache_t *gen_prefix_cache(const gen_t *g) { return g->pc; }

int gen_check_kv(const gen_t *g, gen_kv_acct_t *a)
{
    a->total = kv_pool_total_pages(g->kv);
    a->free = kv_pool_free_pages(g->kv);
    a->cached = g->pc ? prefix_cache_pages(g->pc) : 0;
    const kv_seq_t **seqs = malloc((size_t)g->cfg.max_seqs * sizeof *seqs);
    if (!seqs)
        return river_err_set(RIVER_ENOMEM, "generate: KV check");
    int n = 0, in_use = 0;
    for (int i = 0; i < g->cfg.max_seqs; i++)
        if (g->seqs[i].used) {
            seqs[n++] = &g->seqs[i].kv;
            in_use += g->seqs[i].kv.n_pages;
        }
    int e = 0;
    if (g->pc) {
        e = prefix_cache_check(g->pc, seqs, n, &a->in_use);
    } else {
        a->in_use = in_use;
        if (a->free + a->in_use != a->total)
            e = river_err_set(RIVER_ESTATE, "generate: %d free + %d in use != %d pages",
                              a->free, a->in_use, a->total);
    }
    if (!e && kv_pool_double_frees(g->kv))
        e = river_err_set(RIVER_ESTATE, "generate: %lld pages freed twice",
                          (long long)kv_pool_double_frees(g->kv));
    free(seqs);
    return e;
}

int gen_run_all(gen_t *g)
{
    while (g->n_active > 0) {
        int e = gen_step(g);
        if (e)
            return e;
    }
    return 0;
}
