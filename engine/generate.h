/* Generation: sequences from prompt ids to finished completions, batched. Each step puts
 * one decode row per running sequence and prefill chunks of new sequences into one forward
 * batch (continuous batching), samples, streams text through a callback and stops on
 * EOS, stop strings or max tokens. Finished sequences give their KV pages back at once.
 *
 * The worker's scheduler and `river run` both drive this; it owns the forward scratch and
 * the KV pool of one model on one backend. */
#ifndef RIVER_ENGINE_GENERATE_H
#define RIVER_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/logits.h"
#include "model/model.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/spec_cost.h"
#include "engine/spec_ngram.h"
#include "text/tokenizer.h"

typedef enum {
    GEN_RUNNING = 0,
    GEN_FINISH_LENGTH, /* max_tokens generated */
    GEN_FINISH_EOS,    /* an end-of-sequence id was sampled */
    GEN_FINISH_STOP,   /* a stop string appeared in the text */
    GEN_FINISH_CONTEXT,/* the model's context is full */
    GEN_FINISH_CANCEL,
    GEN_FINISH_ERROR,
} gen_finish_t;

const char *gen_finish_name(gen_finish_t f);

/* kv.dtype as configured (a worker's file, `river --kv-dtype`), in the order of
 * gen_kv_dtype_names. */
typedef enum {
    GEN_KV_AUTO = 0, /* f32 for a backbone of f32 weights, else f16 (as llama.cpp's default) */
    GEN_KV_F32,
    GEN_KV_F16,
    GEN_KV_BF16,
    GEN_KV_Q8, /* symmetric int8, one scale per 32 values (kernels/ops.h kv_view_t) */
    GEN_KV_COUNT
} gen_kv_dtype_t;

/* "auto", "f32", "f16", "bf16", "q8", then NULL. */
extern const char *const gen_kv_dtype_names[];
/* The KV element type a choice gives for model m: the one rule every backend and every
 * command follows. auto is f32 where the backbone's matrices are f32 (the llama2.c goldens
 * stay token-exact against run.c) and f16 where they are 16-bit or quantized. */
dtype_t gen_kv_dtype(const model_t *m, int choice);
/* The choice named `name` (gen_kv_dtype_names), or RIVER_EINVAL naming kv.dtype. */
int gen_kv_dtype_parse(const char *name, int *choice);

typedef struct gen_config {
    int max_rows;      /* rows per forward batch */
    int prefill_chunk; /* prompt rows one sequence may put into one batch */
    int page_size;     /* KV positions per page */
    int n_pages;       /* KV pages in the pool (0: enough for max_seqs full contexts) */
    /* Element type of the pool's K and V, a gen_kv_dtype_t: GEN_KV_AUTO (0, the default)
     * picks it from the backbone (gen_kv_dtype). With kv_pool given, auto takes that
     * pool's type and any other choice must be it. */
    int kv_dtype;
    int max_seqs;      /* sequences running at once */
    /* What a sequence does when the pool has no page for its next position. 0: it ends
     * with GEN_FINISH_ERROR. 1: preemption: the youngest sequence that has no rows in the
     * batch yet (or this one, when there is none) gives all its pages back and later starts
     * over, prefilling its prompt and every id it generated; its sampler, text stream and
     * counters are kept, so its owner sees no token twice and the tokens do not change
     * (greedy, early exit off: the kernels give a row the same values in any batch). A
     * preempted sequence starts again, oldest first, once its whole prefill fits in the
     * free pages; only a sequence that alone needs more pages than the pool has ends with
     * GEN_FINISH_ERROR. */
    int preempt;
    /* A KV pool to use instead of making one (NULL: the generator makes its own): the split
     * pair's shared pool (kv_pool_new_shared). The generator borrows it (it must outlive
     * the generator) and hands out its pages; its layers and kv_dim must be the model's
     * and its page size page_size, and n_pages is then ignored. */
    kv_pool_t *kv_pool;
    /* The prefix cache (engine/prefix_cache.h): 1 keeps full KV pages after their
     * sequence ends and lets new sequences start from the longest cached prefix of their
     * ids. It needs a pool of the generator's own (kv_pool NULL) and, under early exit,
     * the river strategy; it is off otherwise. Greedy tokens do not change with it (a row
     * attends to the same K/V values either way), and a request that must be exact never
     * reuses river-written pages. The cache gives its unreferenced pages back before any
     * sequence is preempted. */
    int prefix_cache;
    int prefix_cache_pages; /* pages the cache may hold, 0: the whole pool */
    uint64_t prefix_seed;   /* prefix_hash_seed of the model and river fingerprints */
    prefix_key_t prefix_key; /* the secret of the cache's page names (prefix_key_random) */
} gen_config_t;

/* One generated token as its owner sees it. text is the newly final UTF-8 text (stop
 * strings removed; may be empty); finish is GEN_RUNNING until the last event of the
 * sequence. A sequence that ends without a new token (cancel, error) gets id -1. */
typedef struct gen_event {
    int seq;
    int32_t id;
    const char *text;
    size_t len;
    gen_finish_t finish;
    int depth;       /* backbone layers the token's row ran before it exited */
    int index;       /* position of the token in the completion, gen_request_t.done
                        included; for an event without a token, the position the next
                        token would have had */
    int err;         /* GEN_FINISH_ERROR: the river_err code of the failure (RIVER_EFULL
                        when the KV pool had no page for it), else 0 */
    int cached_tokens; /* prompt tokens whose K/V the first prefill took from the prefix
                          cache instead of computing them */
    int drafted;     /* lossless: draft tokens verified so far in this completion */
    int accepted;    /* lossless: of which the backbone accepted */
    int drafts;      /* lossless: verify passes that checked at least one draft token */
    /* The token's log-probabilities when its request asked (gen_request_t.logprobs), else
     * NULL; valid during the callback only. */
    const logits_logprob_t *logprob;
} gen_event_t;

typedef void (*gen_token_cb)(void *user, const gen_event_t *ev);

typedef struct gen_request {
    const int32_t *prompt; /* (n_prompt) ids, BOS included if the model wants one */
    size_t n_prompt;
    int max_tokens;
    sampler_params_t sampling;
    const char *const *stop; /* (n_stop) stop strings */
    int n_stop;
    int ignore_eos;          /* keep going past EOS ids (benchmarks, goldens) */
    const exit_row_t *exit;  /* this request's exit thresholds, or NULL: the policy's */
    gen_token_cb on_token;
    void *user;
    /* A completion to continue (a request re-dispatched after its worker died): n_done ids
     * the owner already has. They follow the prompt into the prefill, count toward
     * max_tokens and the random draws of the sampler (so a seeded request continues the
     * same random stream), and go through the text stream and the stop-string hold-back
     * without being reported, so the text reported next joins up with the text reported
     * for them before. NULL/0: a fresh completion. */
    const int32_t *done;
    size_t n_done;
    /* Lossless mode: the sequence drafts tokens on the exit path (the generator's exit
     * policy, which must be the river strategy) and the backbone verifies them, so the
     * ids are the backbone's (greedy: identical; sampling: the same distribution). A
     * resumed lossless completion with sampling does not continue the same random stream
     * (drafting draws numbers too), only the same distribution. */
    int lossless;
    int draft_k;             /* lossless: most draft tokens per verify pass, 1..GEN_DRAFT_MAX;
                                0: the generator's (gen_set_spec) */
    /* The prefix-cache partition (prefix_seq_set_salt): the sequence shares cached pages
     * only with sequences of the same salt. Copied at submit; NULL/0: the empty salt. */
    const void *prefix_salt;
    size_t n_prefix_salt;
    /* Log-probabilities of every generated token in its event (engine/logits.h): logprobs
     * 1 asks for them, top_logprobs (0..LOGITS_TOP_MAX) for the most likely ids beside. */
    int logprobs;
    int top_logprobs;
    /* The grammar the completion follows (NULL: none), bound to the vocabulary of the
     * generator's tokenizer (gen_grammar_vocab's, or another made the same way:
     * grammar_matcher_new) and borrowed until the sequence ends. Every row the
     * sequence samples from is masked by it, drafts included, and done ids are run through
     * it at submit (RIVER_EINVAL when they break it). */
    const grammar_matcher_t *grammar;
} gen_request_t;

/* Speculative decoding with the exit path as the draft model (lossless mode). Each step a
 * lossless sequence either puts one draft row into the batch (its exit thresholds apply)
 * or, once its draft is complete, its last accepted id and the k draft ids as k+1 rows on
 * the full backbone (exit off for those rows), which rewrite the draft's KV slots with
 * backbone values. Greedy: the longest draft prefix equal to the backbone's argmax is
 * accepted, then the backbone's own next id. Sampling: each draft id is accepted with
 * probability min(1, p/q), else replaced by a draw from norm(max(0, p - q)) (speculative
 * sampling), so the ids follow the backbone's distribution exactly. Positions past the
 * accepted ones are rolled back: their slots are rewritten later, whole pages past them go
 * back to the pool. */
#define GEN_DRAFT_MAX SPEC_K_MAX

/* Where a lossless round's draft comes from. */
typedef enum {
    GEN_DRAFT_RIVER = 0, /* the exit path, one draft row a token */
    GEN_DRAFT_NGRAM,     /* prompt lookup (engine/spec_ngram.h), no draft rows; a round
                            without a match verifies no draft (one backbone row) */
    GEN_DRAFT_BOTH,      /* per round, the n-gram draft where one matches and the cost
                            model predicts it faster than the river's, else the river's */
} gen_draft_source_t;

const char *gen_draft_source_name(gen_draft_source_t s);
/* GEN_DRAFT_* for "river", "ngram" or "both"; -1 for anything else. */
int gen_draft_source_parse(const char *name);

typedef struct gen_spec {
    int k_max;      /* draft tokens per verify pass, 1..GEN_DRAFT_MAX (capped at max_rows-1) */
    float min_conf; /* the draft stops after a token whose top probability (softmax of the
                       draft logits) is below this; 0: always k_max tokens */
    /* Measured step times (spec_costs_measure), copied; NULL: every sequence drafts up to
     * k_max. With them the generator picks the draft length that the cost model predicts
     * fastest (spec_pick_k, at most k_max and costs->k_max), at the acceptance rate seen so
     * far (0.9 until 16 draft tokens were verified) and the draft step time measured in
     * serving once there are 8 draft steps, and picks again after every verify pass.
     * Requests with their own draft_k keep it. */
    const spec_costs_t *costs;
    int no_reuse;   /* 1: verification runs every layer instead of resuming each drafted
                       position where its draft left the exact backbone (for comparison:
                       the output is the same) */
    gen_draft_source_t source; /* GEN_DRAFT_RIVER unless set */
    /* N-gram drafts: suffixes of ngram_max down to ngram_min ids are looked up
     * (1 <= ngram_min <= ngram_max <= SPEC_NGRAM_MAX); both 0: 1 and 3. The ids a lookup
     * drafts are verified as a river draft's are (greedy: the same ids as plain decoding;
     * sampling: the draft is a point mass, so the rejection rule keeps the distribution). */
    int ngram_min, ngram_max;
} gen_spec_t;

typedef struct gen gen_t;

/* tok may be NULL (no text, no stop strings). m, tok and be must outlive the generator. */
int gen_new(gen_t **out, const model_t *m, const tokenizer_t *tok, backend_t *be,
            const gen_config_t *cfg);
void gen_destroy(gen_t **g);

/* Turns early exit on for every sequence (NULL: off). See forward_set_exit. */
int gen_set_exit(gen_t *g, const exit_config_t *cfg);

/* Lossless-mode defaults for requests without their own draft_k: k_max 4, min_conf 0
 * until set. RIVER_EINVAL for values outside the ranges. */
int gen_set_spec(gen_t *g, const gen_spec_t *spec);

/* The generator's tokenizer as a grammar sees it (engine/logits.h), made on the first call
 * (about a second for a 128k vocabulary) and owned by the generator: the vocabulary a
 * request's grammar is bound to. RIVER_EINVAL without a tokenizer. */
int gen_grammar_vocab(gen_t *g, const grammar_vocab_t **out);

/* Queues a request; *seq receives its id. RIVER_EFULL when max_seqs are running,
 * RIVER_EINVAL for an empty prompt, one longer than the context (done ids included), done
 * ids that already reach max_tokens, or bad sampling. */
int gen_submit(gen_t *g, const gen_request_t *r, int *seq);
/* Ends a sequence early; its callback gets GEN_FINISH_CANCEL. */
int gen_cancel(gen_t *g, int seq);
/* Runs one batch over the running sequences. A sequence that fails ends with
 * GEN_FINISH_ERROR; the error is returned only when the whole step failed. */
int gen_step(gen_t *g);
/* Sequences submitted and not yet finished. */
int gen_active(const gen_t *g);

/* Runs until every sequence finished. */
int gen_run_all(gen_t *g);

/* The page table of a running sequence and how many of its first positions hold final
 * K/V (prefilled, or decoded; in lossless mode verified by the backbone). The table is
 * valid until the next gen_step. RIVER_ENOTFOUND for a sequence not running. */
int gen_seq_kv(gen_t *g, int seq, const int32_t **pages, int *n_pos);

kv_pool_t *gen_kv_pool(gen_t *g);
forward_t *gen_forward(gen_t *g);

typedef struct gen_stats {
    double prefill_s;   /* wall time of steps that carried prefill rows */
    double decode_s;    /* wall time of decode-only steps */
    int64_t prefill_tokens;
    int64_t decode_tokens; /* tokens sampled in decode-only steps */
    int64_t preemptions;   /* sequences that gave their pages back (gen_config_t.preempt) */
    /* Prefix cache, over the first prefill of each sequence: */
    int64_t prefix_query_tokens; /* prompt tokens looked up */
    int64_t prefix_hit_tokens;   /* of which found cached */
    int64_t prefix_evictions;    /* cached pages given back to the pool */
    int prefix_cache_pages;      /* pages cached now, referenced or not */
    /* Lossless mode, with vLLM's meaning: */
    int64_t spec_drafts;          /* verify passes that checked at least one draft token */
    int64_t spec_draft_tokens;    /* draft tokens verified */
    int64_t spec_accepted_tokens; /* of which accepted */
    int64_t spec_verify_passes;   /* verify passes, empty drafts included */
    /* Of those, the rounds whose draft came from the n-gram lookup (the rest are the
     * river's): */
    int64_t spec_ngram_drafts, spec_ngram_draft_tokens, spec_ngram_accepted_tokens;
    int spec_k;                   /* the draft length new rounds use now (gen_spec_t) */
    double draft_s, verify_s;     /* decode-only steps that had draft rows only / any verify
                                     rows, seconds (the measured costs of the two steps) */
    int64_t draft_steps, verify_steps;
} gen_stats_t;

void gen_get_stats(const gen_t *g, gen_stats_t *st);

/* The prefix cache, NULL when it is off. */
const prefix_cache_t *gen_prefix_cache(const gen_t *g);

/* KV accounting: pages free, cached (shared or unreferenced) and held privately by
 * running sequences; RIVER_ESTATE when they do not add up to the pool or a reference
 * count disagrees with the page tables (prefix_cache_check). */
typedef struct gen_kv_acct {
    int free, cached, in_use, total;
} gen_kv_acct_t;
int gen_check_kv(const gen_t *g, gen_kv_acct_t *a);

#endif
