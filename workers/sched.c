#include "workers/sched.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/rng.h"
#include "engine/kv_pool.h"
#include "kernels/backend.h"

typedef enum {
    SREQ_QUEUED = 0, /* waiting for an engine slot */
    SREQ_RUNNING,    /* an engine sequence */
} sreq_state_t;

typedef struct sreq sreq_t;

/* Longest Submit.prefix_salt taken (riverd's is a key and a tenant, under 200 bytes). */
#define SCHED_SALT_MAX 512
/* Longest Generate.grammar taken: a JSON Schema of a few hundred properties compiles to
 * far less; text/grammar.h bounds what a grammar may cost beyond its size. */
#define SCHED_GRAMMAR_MAX (256 * 1024)
/* Longest token text a log-probability carries. */
#define SCHED_TOKEN_MAX 1024
/* Compiled grammars kept for requests that send the same text again (an agent's tools,
 * a structured-output schema): binding one to a 128k vocabulary can take a few hundred
 * ms, which would otherwise stall every running sequence once per request. */
#define SCHED_GRAMMARS 16

/* One grammar text, compiled and bound to the engine's vocabulary. */
typedef struct sched_grammar {
    char *text;               /* NULL: a free slot */
    size_t len;
    grammar_t *g;
    grammar_matcher_t *m;
    int refs;                 /* requests using it */
    uint64_t used;            /* when it was last asked for (the scheduler's counter) */
} sched_grammar_t;

struct sreq {
    sreq_t *prev, *next;   /* the scheduler's list, in arrival order */
    sched_t *s;
    uint64_t id;
    sreq_state_t state;
    int seq;               /* engine sequence while running */
    int32_t *prompt;       /* (n_prompt) the request's prompt */
    size_t n_prompt;
    int32_t *done;         /* (n_done) ids the client already has (re-dispatch) */
    size_t n_done;
    uint8_t *salt;         /* (n_salt) prefix-cache partition (Submit.prefix_salt) */
    size_t n_salt;
    char **stop;           /* (n_stop) owned; the engine borrows them while running */
    int n_stop;
    sampler_params_t sampling;
    int max_tokens;        /* of the whole completion, done ids included */
    int ignore_eos;
    exit_row_t exit;       /* the request's exit thresholds under the worker's rule */
    int has_exit;
    int lossless;          /* the exit path drafts, the backbone verifies */
    int draft_k;           /* lossless: most draft tokens per pass, 0: the worker's */
    uint32_t drafted, accepted; /* lossless: this dispatch's draft tokens, accepted ones */
    uint32_t drafts;       /* lossless: this dispatch's verify passes with a draft */
    sched_grammar_t *grammar; /* Generate.grammar compiled (a reference), NULL: none */
    int logprobs, top_logprobs; /* Generate.logprobs, top_logprobs */
    int64_t deadline_ms;   /* absolute; 0: none */
    /* A cancel that is really a failure (deadline, drain, shutdown) says so here, so the
     * engine's cancel event becomes Failed instead of Done(CANCELLED). */
    River__Client__Error__Code fail_code;
    const char *fail_msg;
    uint64_t n_msgs;       /* Tokens messages sent in this dispatch */
    uint32_t n_new;        /* tokens generated in this dispatch */
    uint32_t cached_tokens; /* prompt tokens the prefix cache held (Usage.cached_tokens) */
    double depth_sum;
    uint32_t *hist;        /* (n_layers + 1) exit histogram of this dispatch */
};

struct sched {
    gen_t *g;
    const model_t *m;
    const tokenizer_t *tok;
    link_t *link;
    sched_config_t cfg;
    sreq_t *head, *tail;
    int n_queued, n_running;
    bool draining;
    int64_t drain_deadline_ms; /* 0: none */
    River__Client__Error__Code drain_code; /* for what the drain deadline cuts off */
    bool quiet;                /* requests end without a message (reset, destroy) */
    char *text;                /* NUL-terminated copy of an event's text */
    size_t cap_text;
    uint64_t seed_state;       /* rng_next state: seeds for requests that come without one
                                  (riverd normally picks it) */
    /* One token's log-probabilities as a message: the token's and the top ids' bytes. */
    char *lp_bytes;            /* (1 + LOGITS_TOP_MAX, SCHED_TOKEN_MAX) */
    sched_grammar_t grammars[SCHED_GRAMMARS];
    uint64_t grammar_clock;
};

/* ---- Grammars ---- */

static void sched__grammar_clear(sched_grammar_t *c)
{
    grammar_matcher_destroy(&c->m);
    grammar_destroy(&c->g);
    free(c->text);
    memset(c, 0, sizeof *c);
}

/* The compiled grammar of text with a reference for the caller: a cached one, else one
 * compiled into a free slot or the least recently used unreferenced one. Every slot in
 * use by running requests is RIVER_EFULL. */
static int sched__grammar_get(sched_t *s, const char *text, size_t len, sched_grammar_t **out)
{
    sched_grammar_t *slot = NULL;
    for (int i = 0; i < SCHED_GRAMMARS; i++) {
        sched_grammar_t *c = &s->grammars[i];
        if (c->text && c->len == len && !memcmp(c->text, text, len)) {
            c->refs++;
            c->used = ++s->grammar_clock;
            *out = c;
            return 0;
        }
        if (!c->refs && (!slot || (slot->text && (!c->text || c->used < slot->used))))
            slot = c;
    }
    if (!slot)
        return river_err_set(RIVER_EFULL, "%d different grammars in use at once", SCHED_GRAMMARS);
    sched__grammar_clear(slot);
    const grammar_vocab_t *v;
    char detail[512];
    int e = gen_grammar_vocab(s->g, &v);
    if (!e && (e = grammar_parse(&slot->g, text, len))) {
        snprintf(detail, sizeof detail, "%s", river_err_detail());
        e = river_err_set(e == RIVER_ENOMEM ? e : RIVER_EINVAL, "grammar: %s", detail);
    }
    if (!e)
        e = grammar_matcher_new(&slot->m, slot->g, v);
    if (!e && !(slot->text = malloc(len + 1)))
        e = river_err_set(RIVER_ENOMEM, "grammar text");
    if (e) {
        sched__grammar_clear(slot);
        return e;
    }
    memcpy(slot->text, text, len);
    slot->text[len] = '\0';
    slot->len = len;
    slot->refs = 1;
    slot->used = ++s->grammar_clock;
    *out = slot;
    return 0;
}

/* ---- Requests ---- */

static void sched__unlink(sched_t *s, sreq_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        s->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        s->tail = r->prev;
    if (r->state == SREQ_QUEUED)
        s->n_queued--;
    else
        s->n_running--;
}

static void sched__free(sched_t *s, sreq_t *r)
{
    sched__unlink(s, r);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->prompt);
    free(r->done);
    free(r->salt);
    free(r->hist);
    if (r->grammar)
        r->grammar->refs--;
    free(r);
}

static sreq_t *sched__find(const sched_t *s, uint64_t id)
{
    for (sreq_t *r = s->head; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* ---- Replies ---- */

static void sched__failed(sched_t *s, uint64_t id, River__Client__Error__Code code,
                          const char *msg)
{
    if (s->quiet)
        return;
    log_debug("request %llu failed: %s", (unsigned long long)id, msg);
    link_send_failed(s->link, id, code, msg);
}

static void sched__done(sched_t *s, sreq_t *r, River__Client__Final__Reason reason)
{
    if (s->quiet)
        return;
    River__Client__Usage usage = RIVER__CLIENT__USAGE__INIT;
    usage.prompt_tokens = (uint32_t)r->n_prompt;
    usage.completion_tokens = (uint32_t)r->n_done + r->n_new;
    usage.cached_tokens = r->cached_tokens;
    River__Client__ExitStats xs = RIVER__CLIENT__EXIT_STATS__INIT;
    xs.mean_exit_layer = r->n_new ? (float)(r->depth_sum / r->n_new) : 0.0f;
    xs.n_histogram = (size_t)s->m->cfg.n_layers + 1;
    xs.histogram = r->hist;
    xs.drafted_tokens = r->drafted;
    xs.accepted_tokens = r->accepted;
    xs.drafts = r->drafts;
    River__Client__Final f = RIVER__CLIENT__FINAL__INIT;
    f.reason = reason;
    f.usage = &usage;
    f.exit_stats = &xs;
    /* With a prefix cache, a heartbeat first: riverd learns which pages the request left
     * cached before it can place the client's next turn. */
    if (gen_prefix_cache(s->g))
        link_send_heartbeat(s->link);
    link_send_done(s->link, r->id, &f);
}

/* The engine's finish reasons and the protocol's. */
static const River__Client__Final__Reason sched__reasons[] = {
    [GEN_FINISH_LENGTH] = RIVER__CLIENT__FINAL__REASON__LENGTH,
    [GEN_FINISH_EOS] = RIVER__CLIENT__FINAL__REASON__EOS,
    [GEN_FINISH_STOP] = RIVER__CLIENT__FINAL__REASON__STOP,
    [GEN_FINISH_CONTEXT] = RIVER__CLIENT__FINAL__REASON__CONTEXT,
    [GEN_FINISH_CANCEL] = RIVER__CLIENT__FINAL__REASON__CANCELLED,
};

static int sched__text_copy(sched_t *s, const char *text, size_t len)
{
    if (len + 1 > s->cap_text) {
        size_t cap = s->cap_text ? s->cap_text : 256;
        while (cap < len + 1)
            cap *= 2;
        char *p = realloc(s->text, cap);
        if (!p)
            return river_err_set(RIVER_ENOMEM, "token text of %zu bytes", len);
        s->text = p;
        s->cap_text = cap;
    }
    memcpy(s->text, text, len);
    s->text[len] = '\0';
    return 0;
}

/* The bytes of id into slot i of the scheduler's scratch. */
static ProtobufCBinaryData sched__token_bytes(sched_t *s, int i, int32_t id)
{
    char *buf = s->lp_bytes + (size_t)i * SCHED_TOKEN_MAX;
    size_t len = 0;
    if (!s->tok || tokenizer_token_bytes(s->tok, id, buf, SCHED_TOKEN_MAX, &len))
        len = 0;
    return (ProtobufCBinaryData){.len = len, .data = (uint8_t *)buf};
}

/* The message of one token's log-probabilities; it points into lp and the scheduler's
 * scratch, so it lives until the next call. */
static River__Client__TokenLogprob *sched__logprob(sched_t *s, const logits_logprob_t *lp,
                                                   River__Client__TokenLogprob *m,
                                                   ProtobufCBinaryData *tops)
{
    river__client__token_logprob__init(m);
    m->logprob = lp->logprob;
    m->token = sched__token_bytes(s, 0, lp->id);
    m->n_top_ids = m->n_top_logprobs = m->n_top_tokens = (size_t)lp->n_top;
    m->top_ids = (int32_t *)lp->top_ids;
    m->top_logprobs = (float *)lp->top_logprobs;
    for (int i = 0; i < lp->n_top; i++)
        tops[i] = sched__token_bytes(s, 1 + i, lp->top_ids[i]);
    m->top_tokens = tops;
    return m;
}

/* Every engine event of a running request: a Tokens message for a token (or for text
 * without one, which the end of a sequence may flush), then the request's end. */
static void sched__on_event(void *user, const gen_event_t *ev)
{
    sreq_t *r = user;
    sched_t *s = r->s;
    int32_t depth = ev->depth;
    r->cached_tokens = (uint32_t)ev->cached_tokens;
    if (ev->id >= 0) {
        r->n_new++;
        r->depth_sum += depth;
        int L = s->m->cfg.n_layers;
        r->hist[depth < 0 ? 0 : depth > L ? L : depth]++;
    }
    r->drafted = (uint32_t)ev->drafted;
    r->accepted = (uint32_t)ev->accepted;
    r->drafts = (uint32_t)ev->drafts;
    if (!s->quiet && (ev->id >= 0 || ev->len > 0)) {
        River__Client__TokenLogprob lpm, *lpp = NULL;
        ProtobufCBinaryData tops[LOGITS_TOP_MAX];
        if (ev->id >= 0 && ev->logprob)
            lpp = sched__logprob(s, ev->logprob, &lpm, tops);
        if (sched__text_copy(s, ev->text, ev->len) == 0)
            link_send_tokens(s->link, r->id, r->n_msgs++, (uint32_t)ev->index, &ev->id,
                             &depth, ev->id >= 0 ? 1 : 0, s->text, lpp ? &lpp : NULL);
        else
            log_error("request %llu: %s", (unsigned long long)r->id,
                      river_err_detail());
    }
    if (ev->finish == GEN_RUNNING)
        return;
    if (ev->finish == GEN_FINISH_ERROR) {
        char msg[512];
        snprintf(msg, sizeof msg, "generation failed: %s", river_err_detail());
        /* On a lost device nothing is the request's fault, and another worker can serve it. */
        bool lost = s->cfg.be && backend_is_lost(s->cfg.be);
        sched__failed(s, r->id, lost ? RIVER__CLIENT__ERROR__CODE__UNAVAILABLE
                                     : frame_error_code(ev->err), msg);
    } else if (ev->finish == GEN_FINISH_CANCEL && r->fail_code) {
        sched__failed(s, r->id, r->fail_code, r->fail_msg);
    } else {
        sched__done(s, r, sched__reasons[ev->finish]);
    }
    log_debug("request %llu ended: %s after %u tokens", (unsigned long long)r->id,
              gen_finish_name(ev->finish), r->n_new);
    sched__free(s, r);
}

/* Ends a request in any state with Failed(code, msg) (a message unless quiet). */
static void sched__end(sched_t *s, sreq_t *r, River__Client__Error__Code code, const char *msg)
{
    if (r->state == SREQ_RUNNING) {
        r->fail_code = code;
        r->fail_msg = msg;
        if (gen_cancel(s->g, r->seq) == 0)
            return; /* sched__on_event answered and freed it */
        log_error("request %llu: engine lost sequence %d", (unsigned long long)r->id,
                  r->seq);
    }
    sched__failed(s, r->id, code, msg);
    sched__free(s, r);
}

/* ---- Submit ---- */

/* The request's exit override as thresholds under the worker's rule: policy "none" keeps
 * it on the full backbone; tau, theta and the fixed exit layer replace the worker's. Another
 * rule cannot apply (the worker holds one river and one router set for its own rule), so
 * *other_rule says it was asked. RIVER_EINVAL for an unknown rule or a bad value. */
static int sched__override(const sched_t *s, const River__Client__ExitOverride *x,
                           exit_row_t *row, int *has, bool *other_rule)
{
    const exit_policy_t *p = &s->cfg.policy;
    *row = (exit_row_t){.tau = p->tau, .theta = p->theta, .exit_layer = p->exit_layer};
    *has = 0;
    *other_rule = false;
    if (!x)
        return 0;
    if (x->policy && x->policy[0]) {
        int rule = exit_rule_parse(x->policy);
        if (rule < 0)
            return river_err_set(RIVER_EINVAL, "exit.policy '%s' is not none, cosine, router "
                                 "or fixed", x->policy);
        if (rule == EXIT_RULE_NONE)
            row->off = 1;
        else
            *other_rule = rule != (int)p->rule;
    }
    if (x->opt_tau_case)
        row->tau = x->tau;
    if (x->opt_theta_case) {
        if (!(x->theta >= 0 && x->theta <= 1))
            return river_err_set(RIVER_EINVAL, "exit.theta %g must be in [0, 1]",
                                 (double)x->theta);
        row->theta = x->theta;
    }
    if (x->opt_exit_layer_case) {
        if (x->exit_layer < 1 || x->exit_layer > s->m->cfg.n_layers)
            return river_err_set(RIVER_EINVAL, "exit.exit_layer %d must be in 1..%d",
                                 x->exit_layer, s->m->cfg.n_layers);
        row->exit_layer = x->exit_layer;
    }
    *has = row->off || x->opt_tau_case || x->opt_theta_case || x->opt_exit_layer_case;
    return 0;
}

/* The request's mode: its own lossless field, else the worker's exit.mode. Lossless on a
 * worker that cannot draft, or with policy none, is the request's error. */
static int sched__mode(const sched_t *s, const River__Client__ExitOverride *x, sreq_t *r)
{
    bool asked = x && x->opt_lossless_case;
    /* A request kept on the backbone (policy none) has nothing to draft with: the
     * worker's default does not apply to it, and asking for lossless is an error. */
    r->lossless = asked ? x->lossless : s->cfg.lossless && !(r->has_exit && r->exit.off);
    if (x && x->draft_tokens > GEN_DRAFT_MAX)
        return river_err_set(RIVER_EINVAL, "exit.draft_tokens %u must be in 1..%d (0: the "
                             "worker's)", x->draft_tokens, GEN_DRAFT_MAX);
    r->draft_k = x ? (int)x->draft_tokens : 0;
    if (!r->lossless)
        return 0;
    if (!s->cfg.can_lossless)
        return river_err_set(RIVER_EINVAL, "exit.lossless: this worker cannot draft (it needs "
                             "an exit rule other than none and a river; its rule is %s)",
                             exit_rule_name(s->cfg.policy.rule));
    if (r->has_exit && r->exit.off)
        return river_err_set(RIVER_EINVAL, "exit.lossless with exit.policy none: the backbone "
                             "alone has nothing to draft with");
    return 0;
}


/* Tokenizes a text prompt: special tokens matched anywhere, or only inside the byte
 * ranges the request names (special_spans: the template's own text of a rendered chat
 * prompt), so that a special token's text a user wrote stays text. */
static int sched__encode(const sched_t *s, const River__Client__Generate *gen, int32_t **ids,
                         size_t *n)
{
    size_t len = strlen(gen->text);
    int add_special = gen->text_has_special ? 0 : 1;
    const River__Client__TextSpans *sp = gen->special_spans;
    if (!sp)
        return tokenizer_encode(s->tok, gen->text, len, add_special, ids, n);
    if (sp->n_bounds % 2)
        return river_err_set(RIVER_EINVAL, "special_spans has %zu bounds: not start, end pairs",
                             sp->n_bounds);
    size_t ns = sp->n_bounds / 2;
    text_span_t *spans = malloc((ns ? ns : 1) * sizeof *spans);
    if (!spans)
        return river_err_set(RIVER_ENOMEM, "%zu special spans", ns);
    for (size_t i = 0; i < ns; i++) {
        uint32_t a = sp->bounds[2 * i], b = sp->bounds[2 * i + 1];
        spans[i] = (text_span_t){a, b >= a ? b - a : SIZE_MAX}; /* backwards: refused below */
    }
    int e = tokenizer_encode_spans(s->tok, gen->text, len, add_special, spans, ns, ids, n);
    free(spans);
    return e;
}

/* Fills r from the Submit: prompt ids (tokenizing text), done ids, stop strings, sampling,
 * limits. An error is the request's fault (its detail is the Failed message). */
static int sched__parse(sched_t *s, sreq_t *r, const River__Worker__Submit *m, int64_t now)
{
    const River__Client__Generate *gen = m->generate;
    if (!gen)
        return river_err_set(RIVER_EINVAL, "Submit without a Generate");
    int ctx = s->m->cfg.max_seq_len;
    switch (gen->prompt_case) {
    case RIVER__CLIENT__GENERATE__PROMPT_TEXT: {
        if (!s->tok)
            return river_err_set(RIVER_EINVAL, "this worker has no tokenizer: send token ids");
        /* A text that carries its special tokens (a rendered chat template) gets no BOS
         * from the post-processor: it has one already. */
        int e = sched__encode(s, gen, &r->prompt, &r->n_prompt);
        if (e)
            return e;
        break;
    }
    case RIVER__CLIENT__GENERATE__PROMPT_TOKENS:
        if (!gen->tokens)
            return river_err_set(RIVER_EINVAL, "prompt tokens missing");
        r->n_prompt = gen->tokens->n_ids;
        r->prompt = malloc((r->n_prompt ? r->n_prompt : 1) * sizeof *r->prompt);
        if (!r->prompt)
            return river_err_set(RIVER_ENOMEM, "prompt of %zu ids", r->n_prompt);
        memcpy(r->prompt, gen->tokens->ids, r->n_prompt * sizeof *r->prompt);
        break;
    default:
        return river_err_set(RIVER_EINVAL, "Generate has no prompt");
    }
    if (r->n_prompt == 0)
        return river_err_set(RIVER_EINVAL, "empty prompt");
    if (r->n_prompt >= (size_t)ctx)
        return river_err_set(RIVER_EINVAL, "prompt of %zu tokens does not fit the context of "
                             "%d", r->n_prompt, ctx);
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->m->cfg.vocab_size)
            return river_err_set(RIVER_EINVAL, "prompt id %d outside the vocabulary of %d",
                                 r->prompt[i], s->m->cfg.vocab_size);
    if (m->prefix_salt.len > SCHED_SALT_MAX)
        return river_err_set(RIVER_EINVAL, "prefix_salt of %zu bytes, over %d",
                             m->prefix_salt.len, SCHED_SALT_MAX);
    if (m->prefix_salt.len) {
        r->salt = malloc(m->prefix_salt.len);
        if (!r->salt)
            return river_err_set(RIVER_ENOMEM, "prefix_salt");
        memcpy(r->salt, m->prefix_salt.data, m->prefix_salt.len);
        r->n_salt = m->prefix_salt.len;
    }
    if (m->tokens_delivered != m->n_delivered_ids)
        return river_err_set(RIVER_EINVAL, "tokens_delivered %u but %zu delivered_ids",
                             m->tokens_delivered, m->n_delivered_ids);
    if (m->n_delivered_ids) {
        r->n_done = m->n_delivered_ids;
        r->done = malloc(r->n_done * sizeof *r->done);
        if (!r->done)
            return river_err_set(RIVER_ENOMEM, "%zu delivered ids", r->n_done);
        memcpy(r->done, m->delivered_ids, r->n_done * sizeof *r->done);
        for (size_t i = 0; i < r->n_done; i++)
            if (r->done[i] < 0 || r->done[i] >= s->m->cfg.vocab_size)
                return river_err_set(RIVER_EINVAL, "delivered id %d outside the vocabulary",
                                     r->done[i]);
    }
    /* 0 is riverd's limit; the context bounds any completion anyway. */
    r->max_tokens = gen->max_tokens && gen->max_tokens < INT_MAX ? (int)gen->max_tokens : ctx;
    if (gen->n_stop > (size_t)s->cfg.max_stop)
        return river_err_set(RIVER_EINVAL, "%zu stop strings, at most %d", gen->n_stop,
                             s->cfg.max_stop);
    if (gen->n_stop) {
        r->stop = calloc(gen->n_stop, sizeof *r->stop);
        if (!r->stop)
            return river_err_set(RIVER_ENOMEM, "stop strings");
        for (size_t i = 0; i < gen->n_stop; i++) {
            size_t len = strlen(gen->stop[i]);
            if (len > (size_t)s->cfg.max_stop_bytes)
                return river_err_set(RIVER_EINVAL, "stop string of %zu bytes, at most %d", len,
                                     s->cfg.max_stop_bytes);
            if (!(r->stop[r->n_stop] = strdup(gen->stop[i])))
                return river_err_set(RIVER_ENOMEM, "stop strings");
            r->n_stop++;
        }
        if (!s->tok)
            return river_err_set(RIVER_EINVAL, "stop strings need a tokenizer");
    }
    const River__Client__Sampling *sp = gen->sampling;
    if (sp) {
        if (!isfinite(sp->temperature) || sp->temperature < 0 || sp->top_k > INT_MAX ||
            !(sp->top_p >= 0 && sp->top_p <= 1))
            return river_err_set(RIVER_EINVAL, "sampling: temperature %g, top_k %u, top_p %g "
                                 "(temperature >= 0, top_p in [0, 1])",
                                 (double)sp->temperature, sp->top_k, (double)sp->top_p);
        r->sampling.temperature = sp->temperature;
        r->sampling.top_k = (int)sp->top_k;
        r->sampling.top_p = sp->top_p;
        r->sampling.seed = sp->opt_seed_case ? sp->seed : rng_next(&s->seed_state);
    }
    r->ignore_eos = gen->ignore_eos;
    r->deadline_ms = gen->deadline_ms ? now + gen->deadline_ms : 0;
    if (gen->top_logprobs > LOGITS_TOP_MAX)
        return river_err_set(RIVER_EINVAL, "top_logprobs %u, at most %d", gen->top_logprobs,
                             LOGITS_TOP_MAX);
    r->logprobs = gen->logprobs || gen->top_logprobs;
    r->top_logprobs = (int)gen->top_logprobs;
    if (gen->grammar && gen->grammar[0]) {
        size_t len = strlen(gen->grammar);
        if (len > SCHED_GRAMMAR_MAX)
            return river_err_set(RIVER_EINVAL, "grammar of %zu bytes, at most %d", len,
                                 SCHED_GRAMMAR_MAX);
        if (!s->tok)
            return river_err_set(RIVER_EINVAL, "a grammar needs a tokenizer, and this worker "
                                 "has none");
        int e = sched__grammar_get(s, gen->grammar, len, &r->grammar);
        if (e)
            return e;
    }
    bool other_rule;
    int e = sched__override(s, gen->exit, &r->exit, &r->has_exit, &other_rule);
    if (e)
        return e;
    if ((e = sched__mode(s, gen->exit, r)))
        return e;
    if (other_rule)
        log_debug("request %llu: exit.policy %s asked; the worker's rule %s applies "
                  "(with the request's thresholds)", (unsigned long long)r->id, gen->exit->policy,
                  exit_rule_name(s->cfg.policy.rule));
    return 0;
}

void sched_submit(sched_t *s, const River__Worker__Submit *m, int64_t now)
{
    uint64_t id = m->request_id;
    if (id == 0) {
        /* 0 is what Failed carries for frames without a request; a request never has it. */
        sched__failed(s, 0, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT,
                      "Submit with request_id 0");
        return;
    }
    if (sched__find(s, id)) {
        /* riverd's ids are unique, so this is its bug. The request already here keeps
         * going and ends with its own Done or Failed; a Failed for the copy would carry
         * the same id and read as the end of the first one. */
        log_warn("request %llu submitted again while it runs; ignoring the copy",
                 (unsigned long long)id);
        return;
    }
    if (s->draining) {
        sched__failed(s, id, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE, "worker is draining");
        return;
    }
    if (s->n_queued >= s->cfg.max_queue) {
        char msg[96];
        snprintf(msg, sizeof msg, "worker queue full (%d waiting)", s->n_queued);
        sched__failed(s, id, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED, msg);
        return;
    }
    int L = s->m->cfg.n_layers;
    sreq_t *r = calloc(1, sizeof *r);
    uint32_t *hist = calloc((size_t)L + 1, sizeof *hist);
    if (!r || !hist) {
        free(r);
        free(hist);
        sched__failed(s, id, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    r->s = s;
    r->id = id;
    r->hist = hist;
    r->seq = -1;
    r->state = SREQ_QUEUED;
    /* On the list first, so that every way out below is sched__free. */
    r->prev = s->tail;
    if (s->tail)
        s->tail->next = r;
    else
        s->head = r;
    s->tail = r;
    s->n_queued++;
    int e = sched__parse(s, r, m, now);
    if (e) {
        sched__failed(s, id, frame_error_code(e), river_err_detail());
        sched__free(s, r);
        return;
    }
    int ctx = s->m->cfg.max_seq_len;
    /* A re-dispatch of a request that had everything: nothing is left to generate. */
    if (r->n_done >= (size_t)r->max_tokens || r->n_prompt + r->n_done >= (size_t)ctx) {
        sched__done(s, r, r->n_done >= (size_t)r->max_tokens
                              ? RIVER__CLIENT__FINAL__REASON__LENGTH
                              : RIVER__CLIENT__FINAL__REASON__CONTEXT);
        sched__free(s, r);
        return;
    }
    /* A prompt the whole pool cannot hold would wait forever. */
    kv_pool_t *kv = gen_kv_pool(s->g);
    int page = kv_pool_page_size(kv);
    size_t need = (r->n_prompt + r->n_done + 1 + (size_t)page - 1) / (size_t)page;
    if (need > (size_t)kv_pool_total_pages(kv)) {
        char msg[128];
        snprintf(msg, sizeof msg, "prompt needs %zu KV pages, the worker has %d", need,
                 kv_pool_total_pages(kv));
        sched__failed(s, id, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED, msg);
        sched__free(s, r);
        return;
    }
    log_debug("request %llu queued: %zu prompt tokens, %zu delivered, max %d",
              (unsigned long long)id, r->n_prompt, r->n_done, r->max_tokens);
}

/* ---- Control ---- */

void sched_cancel(sched_t *s, uint64_t request_id)
{
    sreq_t *r = sched__find(s, request_id);
    if (!r)
        return;
    log_debug("request %llu cancelled", (unsigned long long)request_id);
    if (r->state == SREQ_RUNNING && gen_cancel(s->g, r->seq) == 0)
        return; /* the cancel event sent Done(CANCELLED) and freed it */
    sched__done(s, r, RIVER__CLIENT__FINAL__REASON__CANCELLED);
    sched__free(s, r);
}

void sched_drain(sched_t *s, uint32_t deadline_ms, int64_t now,
                 River__Client__Error__Code code)
{
    int64_t deadline = deadline_ms ? now + deadline_ms : 0;
    if (!s->draining || (deadline && (!s->drain_deadline_ms || deadline < s->drain_deadline_ms))) {
        s->drain_deadline_ms = deadline;
        s->drain_code = code;
    }
    if (!s->draining)
        log_info("draining: %d running, %d queued, deadline %s", s->n_running,
                 s->n_queued, deadline_ms ? "set" : "none");
    s->draining = true;
}

void sched_fail_all(sched_t *s, River__Client__Error__Code code, const char *message)
{
    while (s->head)
        sched__end(s, s->head, code, message);
}

void sched_drop_all(sched_t *s)
{
    bool was = s->quiet;
    s->quiet = true;
    sched_fail_all(s, RIVER__CLIENT__ERROR__CODE__CANCELLED, "dropped");
    s->quiet = was;
}

/* Deadlines of requests, and of the drain. */
static void sched__expire(sched_t *s, int64_t now)
{
    if (s->draining && s->drain_deadline_ms && now >= s->drain_deadline_ms) {
        if (s->head)
            log_warn("drain deadline: cancelling %d running, %d queued", s->n_running,
                     s->n_queued);
        sched_fail_all(s, s->drain_code, "the worker's drain deadline passed");
    }
    sreq_t *next;
    for (sreq_t *r = s->head; r; r = next) {
        next = r->next;
        if (r->deadline_ms && now >= r->deadline_ms) {
            /* Ending r never ends another request, so next stays valid. */
            sched__end(s, r, RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED,
                       "deadline exceeded on the worker");
        }
    }
}

/* Moves queued requests into the engine, oldest first, while it has slots. */
static void sched__admit(sched_t *s)
{
    sreq_t *next;
    for (sreq_t *r = s->head; r && s->n_queued > 0; r = next) {
        next = r->next;
        if (r->state != SREQ_QUEUED)
            continue;
        gen_request_t req = {
            .prompt = r->prompt, .n_prompt = r->n_prompt, .max_tokens = r->max_tokens,
            .sampling = r->sampling, .stop = (const char *const *)r->stop,
            .n_stop = r->n_stop, .ignore_eos = r->ignore_eos,
            .exit = r->has_exit ? &r->exit : NULL,
            .on_token = sched__on_event, .user = r,
            .done = r->done, .n_done = r->n_done,
            .lossless = r->lossless, .draft_k = r->draft_k,
            .prefix_salt = r->salt, .n_prefix_salt = r->n_salt,
            .logprobs = r->logprobs, .top_logprobs = r->top_logprobs,
            .grammar = r->grammar ? r->grammar->m : NULL,
        };
        int seq;
        int e = gen_submit(s->g, &req, &seq);
        if (e == RIVER_EFULL)
            return; /* keep it queued until a sequence ends */
        if (e) {
            sched__failed(s, r->id, frame_error_code(e), river_err_detail());
            sched__free(s, r);
            continue;
        }
        r->state = SREQ_RUNNING;
        r->seq = seq;
        s->n_queued--;
        s->n_running++;
    }
}

int sched_step(sched_t *s, int64_t now)
{
    sched__expire(s, now);
    sched__admit(s);
    if (gen_active(s->g) == 0)
        return 0;
    int e = gen_step(s->g);
    if (e)
        log_error("engine step failed: %s", river_err_detail());
    return e;
}

bool sched_busy(const sched_t *s) { return s->n_running > 0 || s->n_queued > 0; }

int64_t sched_next_ms(const sched_t *s)
{
    int64_t t = INT64_MAX;
    if (s->draining && s->drain_deadline_ms)
        t = s->drain_deadline_ms;
    for (const sreq_t *r = s->head; r; r = r->next)
        if (r->deadline_ms && r->deadline_ms < t)
            t = r->deadline_ms;
    return t;
}

bool sched_drained(const sched_t *s) { return s->draining && !s->head; }

void sched_status(const sched_t *s, link_status_t *st)
{
    /* Cached pages nobody uses are free for a new request: the cache gives them back. */
    const prefix_cache_t *pc = gen_prefix_cache(s->g);
    st->kv_pages_free = (uint32_t)(kv_pool_free_pages(gen_kv_pool(s->g)) +
                                   (pc ? prefix_cache_evictable(pc) : 0));
    st->queue_length = (uint32_t)s->n_queued;
    st->running = (uint32_t)s->n_running;
    st->draining = s->draining;
    st->prefix_cache_pages = pc ? (uint32_t)prefix_cache_pages(pc) : 0;
    st->n_prefix_pages = pc ? prefix_cache_summary(pc, st->prefix_pages, LINK_PREFIX_PAGES)
                            : 0;
}

/* ---- Life ---- */

int sched_new(sched_t **out, gen_t *g, const model_t *m, const tokenizer_t *tok, link_t *link,
              const sched_config_t *cfg)
{
    sched_t *s = calloc(1, sizeof *s);
    char *lp = malloc((1 + LOGITS_TOP_MAX) * (size_t)SCHED_TOKEN_MAX);
    if (!s || !lp) {
        free(s);
        free(lp);
        return river_err_set(RIVER_ENOMEM, "scheduler");
    }
    s->lp_bytes = lp;
    s->g = g;
    s->m = m;
    s->tok = tok;
    s->link = link;
    s->cfg = *cfg;
    s->seed_state = (uint64_t)clock_now_ms() ^ 0x5DEECE66Dull;
    *out = s;
    return 0;
}

void sched_destroy(sched_t **sp)
{
    sched_t *s = *sp;
    if (!s)
        return;
    s->quiet = true;
    sched_fail_all(s, RIVER__CLIENT__ERROR__CODE__CANCELLED, "worker stopping");
    free(s->text);
    free(s->lp_bytes);
    for (int i = 0; i < SCHED_GRAMMARS; i++)
        sched__grammar_clear(&s->grammars[i]);
    free(s);
    *sp = NULL;
}
