/* The worker's scheduler: requests from the link in, the engine's events out.
 *
 * A Submit is checked and tokenized at once (a bad one is answered with Failed right
 * away), then waits in a FIFO queue until the engine has a free sequence slot
 * (continuous batching: gen_submit says RIVER_EFULL while max_seqs run). Each
 * sched_step expires deadlines, admits what fits and runs one gen_step, and every
 * engine event goes out as it happens: a Tokens message per token (seq counting the
 * messages of this dispatch from 0, index the token's place in the whole completion),
 * then Done (finish reason, usage, exit statistics) or Failed (an error code).
 *
 * A re-dispatched Submit carries the ids the client already has; the engine continues
 * that completion (gen_request_t.done), so the stream goes on where the dead worker
 * left it, without duplicates.
 *
 * Per-request exit overrides: the engine runs one exit policy per worker (gen_set_exit
 * sets it for every sequence of the forward pass), so a request's ExitOverride cannot
 * apply; the worker's configured policy serves every request, and an override that asks
 * for something else is logged.
 *
 * Lossless mode: a request asks with ExitOverride.lossless (absent: the worker's exit.mode)
 * and draft_tokens; the engine drafts on the worker's exit rule and verifies on the
 * backbone, in the same batches as the other requests. Lossless on a worker without an
 * exit rule or river, or with policy none, fails with INVALID_ARGUMENT; Done's exit
 * statistics carry the drafted and accepted counts of the dispatch. */
#ifndef RIVER_WORKERS_SCHED_H
#define RIVER_WORKERS_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/exit.h"
#include "engine/generate.h"
#include "workers/link.h"

typedef struct sched sched_t;

typedef struct sched_config {
    int max_queue;        /* requests waiting for a slot; one more is RESOURCE_EXHAUSTED */
    int max_stop;         /* stop strings per request */
    int max_stop_bytes;   /* bytes of one stop string */
    exit_policy_t policy; /* the worker's exit policy (to tell overrides apart) */
    int lossless;         /* requests' default mode: 1 lossless (exit.mode) */
    int can_lossless;     /* the worker has an exit rule and a river to draft with */
    const backend_t *be;  /* the engine's backend: a request that fails on a lost device
                             (backend_info.lost) fails UNAVAILABLE, which riverd sends to
                             another worker; NULL: never */
} sched_config_t;

/* g, m and tok (NULL: token-id prompts only) must outlive the scheduler; messages go
 * out through link. */
int sched_new(sched_t **out, gen_t *g, const model_t *m, const tokenizer_t *tok, link_t *link,
              const sched_config_t *cfg);
/* Ends every request without a message and frees the scheduler. */
void sched_destroy(sched_t **s);

void sched_submit(sched_t *s, const River__Worker__Submit *m, int64_t now);
/* Ends a request with Done(CANCELLED); unknown ids are ignored (it may have just ended). */
void sched_cancel(sched_t *s, uint64_t request_id);
/* Takes nothing new; what is queued and running finishes. deadline_ms > 0: whatever is
 * left after that long fails with `code` (riverd's Drain: CANCELLED, which riverd
 * re-dispatches from a worker it is draining; a signal: UNAVAILABLE, which it re-dispatches
 * from any worker). A later drain may only shorten the deadline. */
void sched_drain(sched_t *s, uint32_t deadline_ms, int64_t now,
                 River__Client__Error__Code code);
/* Ends every request without a message (riverd has forgotten them). */
void sched_drop_all(sched_t *s);
/* Ends every request with Failed(code, message). */
void sched_fail_all(sched_t *s, River__Client__Error__Code code, const char *message);

/* Expires deadlines, admits queued requests and runs one engine step. Returns the
 * engine's error when the whole step failed (its requests have been failed). */
int sched_step(sched_t *s, int64_t now);
/* Whether sched_step has work now (the poll loop then does not wait). */
bool sched_busy(const sched_t *s);
/* The next deadline (absolute, clock_now_ms), INT64_MAX when none. */
int64_t sched_next_ms(const sched_t *s);
/* Draining, and nothing is left. */
bool sched_drained(const sched_t *s);
void sched_status(const sched_t *s, link_status_t *st);

#endif
