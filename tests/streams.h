/* The stream checker of the fault suites (test_faults, test_multihost): greedy reference
 * completions from `river run`, streams of real client connections against riverd, and
 * the verdict on each stream.
 *
 * A stream passes when it either completed exactly once, with exactly the tokens of the
 * reference run, or ended with an explicit error code and message after a prefix of
 * them. None may be lost (every stream ends, none is left waiting), and no token index may
 * arrive twice (chunk sequence numbers are consecutive from 0 and the tokens are a prefix
 * of the reference, so a repeated or skipped token shows as a mismatch). */
#ifndef RIVER_TESTS_STREAMS_H
#define RIVER_TESTS_STREAMS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "client/river_client.h"

#define STREAMS_MAX_IDS 1024
#define STREAMS_MAX_TEXT 16384
/* How long a stream may take in any test before it counts as lost (a hang). */
#define STREAMS_LIMIT_S 60

/* The prompts the loads use, in turn. */
extern const char *const streams_prompts[];
#define STREAMS_N_PROMPTS 4

/* ---- The reference: `river run --output json`, greedy, in-process ---- */

typedef struct streams_expect {
    int32_t ids[STREAMS_MAX_IDS];
    size_t n;
    char text[STREAMS_MAX_TEXT];
    double decode_tok_s;    /* what `river run` measured */
} streams_expect_t;

/* max_tokens tokens of `model` after `prompt`, EOS ignored. */
void streams_expect(const char *model, const char *prompt, int max_tokens, streams_expect_t *e);
/* The same, ending at EOS unless ignore_eos (then exactly max_tokens). */
void streams_expect_eos(const char *model, const char *prompt, int max_tokens, int ignore_eos,
                        streams_expect_t *e);
/* One reference per prompt of streams_prompts; want has STREAMS_N_PROMPTS entries. */
void streams_expect_all(const char *model, int max_tokens, streams_expect_t *want);

/* ---- One stream ---- */

typedef struct streams_stream {
    const streams_expect_t *want;
    int32_t ids[STREAMS_MAX_IDS];
    size_t n_ids;
    char text[STREAMS_MAX_TEXT]; /* the chunks' text, NUL-terminated, while it fits */
    size_t n_text;
    uint64_t next_seq;
    int bad_seq;       /* chunks out of sequence: a gap or a repeat */
    int extra_end;     /* events after the end */
    int ended;
    river_event_kind_t end;
    river_code_t code;
    river_finish_t finish;
    uint32_t completion;
    char msg[512];
    double end_at;     /* clock_now_s() at the end */
    atomic_long *progress; /* tokens seen, shared by a load */
} streams_stream_t;

/* The river_event_cb of a stream (user: the streams_stream_t). */
void streams_on_event(void *user, const river_event_t *ev);
/* The verdict on one stream: 1 when it completed exactly once with exactly the reference
 * tokens, 0 when it ended with an explicit error after a prefix of them; a failed check
 * for anything else (no end, a gap or repeat, a wrong token, a second end). */
int streams_check(const streams_stream_t *s, const char *what);
/* A stream that must have completed: consecutive chunks, a Final, exactly the expected
 * tokens and the usage counting them. */
void streams_check_complete(const streams_stream_t *s, const char *what);
/* Whatever happened, the stream ended explicitly and what arrived is a prefix of the
 * expected completion, without gaps or repeats. */
void streams_check_prefix(const streams_stream_t *s, const char *what);

/* ---- A load: n streams, each on a connection and thread of its own ---- */

typedef struct streams_job {
    const char *endpoint;
    const river_keys_t *keys; /* NULL: plain */
    river_generate_opts_t opts;
    streams_stream_t *st;
    int rc;
    char err[256];           /* the library's message when rc < 0 */
} streams_job_t;

/* ---- riverd's admin endpoint (keys NULL: plain) ---- */

/* Waits until riverd counts n ready workers; fails the test after ms, naming dir (where the
 * logs are). */
void streams_wait_ready(const char *admin, const river_keys_t *keys, int n, int ms,
                        const char *dir);
/* A counter of riverd's metrics: the value on the line that starts with `name `. Fails the
 * test when there is none. */
long streams_metric(const char *admin, const river_keys_t *keys, const char *name);

/* Runs one job to its end on the calling thread (a pthread start routine). */
void *streams_job_run(void *arg);

typedef struct streams_load {
    int n;
    streams_stream_t *st;
    streams_job_t *jobs;
    pthread_t *th;
    atomic_long progress;
} streams_load_t;

/* Starts n streams, prompts in turn, `tokens` each, against endpoint with keys (NULL:
 * plain). timeout_ms is the client library's silence limit (0: none, so that only the
 * library's own view of the connection can end a stream whose server vanished). Each
 * stream gives up after STREAMS_LIMIT_S and is then reported lost. */
void streams_load_start(streams_load_t *l, const char *endpoint, const river_keys_t *keys,
                        int n, const streams_expect_t *want, int tokens, uint32_t timeout_ms);
/* Waits until the streams together have `tokens` tokens (or 30 s); returns what they
 * have. */
long streams_load_wait(streams_load_t *l, long tokens);
/* Joins the streams and checks each; returns how many completed (the rest failed
 * explicitly, each printed with its code). */
int streams_load_finish(streams_load_t *l, const char *what);
void streams_load_free(streams_load_t *l);

#endif
