#include "tests/streams.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "tests/proc.h"
#include "tests/testutil.h"

const char *const streams_prompts[STREAMS_N_PROMPTS] = {
    "Once upon a time",
    "The little dog",
    "Lily and Ben went to the park",
    "One day, a big bear",
};

/* ---- The reference ---- */

void streams_expect_eos(const char *model, const char *prompt, int max_tokens, int ignore_eos,
                        streams_expect_t *e)
{
    ck_assert_int_le(max_tokens, STREAMS_MAX_IDS);
    char n[16];
    snprintf(n, sizeof n, "%d", max_tokens);
    char *argv[] = {(char *)test_bin("river"), "run", "--model", (char *)model, "--prompt",
                    (char *)prompt, "--max-tokens", n, "--threads", "1", "--output", "json",
                    ignore_eos ? "--ignore-eos" : NULL, NULL};
    char *out;
    ck_assert_int_eq(test_capture(argv, NULL, 0, &out), 0);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    ck_assert_msg(o, "river run output: %.300s", out);
    json_t *ids = json_object_get(o, "ids");
    e->n = json_array_size(ids);
    if (ignore_eos)
        ck_assert_uint_eq(e->n, (size_t)max_tokens);
    ck_assert_uint_le(e->n, STREAMS_MAX_IDS);
    for (size_t i = 0; i < e->n; i++)
        e->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
    const char *text = json_string_value(json_object_get(o, "text"));
    snprintf(e->text, sizeof e->text, "%s", text ? text : "");
    e->decode_tok_s = json_real_value(json_object_get(o, "decode_tok_s"));
    json_decref(o);
    free(out);
}

void streams_expect(const char *model, const char *prompt, int max_tokens, streams_expect_t *e)
{
    streams_expect_eos(model, prompt, max_tokens, 1, e);
}

void streams_expect_all(const char *model, int max_tokens, streams_expect_t *want)
{
    for (int p = 0; p < STREAMS_N_PROMPTS; p++)
        streams_expect(model, streams_prompts[p], max_tokens, &want[p]);
}

/* ---- One stream ---- */

void streams_on_event(void *user, const river_event_t *ev)
{
    streams_stream_t *s = user;
    if (s->ended) {
        s->extra_end++;
        return;
    }
    if (ev->kind == RIVER_EVENT_CHUNK) {
        if (ev->seq != s->next_seq)
            s->bad_seq++;
        s->next_seq = ev->seq + 1;
        for (size_t i = 0; i < ev->n_ids; i++) {
            if (s->n_ids == STREAMS_MAX_IDS) {
                s->bad_seq++;
                break;
            }
            s->ids[s->n_ids++] = ev->ids[i];
        }
        if (s->n_text + ev->text_len < sizeof s->text) {
            memcpy(s->text + s->n_text, ev->text, ev->text_len);
            s->n_text += ev->text_len;
            s->text[s->n_text] = '\0';
        }
        if (s->progress)
            atomic_fetch_add(s->progress, (long)ev->n_ids);
        return;
    }
    s->ended = 1;
    s->end = ev->kind;
    s->code = ev->code;
    s->finish = ev->finish;
    s->completion = ev->completion_tokens;
    s->end_at = clock_now_s();
    snprintf(s->msg, sizeof s->msg, "%s", ev->message ? ev->message : "");
}

int streams_check(const streams_stream_t *s, const char *what)
{
    ck_assert_msg(s->ended, "%s: lost: no end after %zu tokens", what, s->n_ids);
    ck_assert_msg(!s->extra_end, "%s: %d events after its end", what, s->extra_end);
    ck_assert_msg(!s->bad_seq, "%s: chunk sequence numbers not consecutive", what);
    ck_assert_msg(s->n_ids <= s->want->n, "%s: %zu tokens, more than the %zu expected", what,
                  s->n_ids, s->want->n);
    for (size_t i = 0; i < s->n_ids; i++)
        ck_assert_msg(s->ids[i] == s->want->ids[i], "%s: token %zu is %d, expected %d", what,
                      i, s->ids[i], s->want->ids[i]);
    if (s->end == RIVER_EVENT_FINAL) {
        ck_assert_msg(s->n_ids == s->want->n, "%s: Final after %zu of %zu tokens", what,
                      s->n_ids, s->want->n);
        ck_assert_msg(s->completion == s->n_ids, "%s: usage says %u tokens, got %zu", what,
                      s->completion, s->n_ids);
        return 1;
    }
    ck_assert_msg(s->code != RIVER_CODE_OK && s->msg[0], "%s: an error without a code or a "
                  "message", what);
    return 0;
}

void streams_check_complete(const streams_stream_t *s, const char *what)
{
    ck_assert_msg(s->ended, "%s: no end", what);
    ck_assert_msg(s->end == RIVER_EVENT_FINAL, "%s: ended with %s: %s", what,
                  river_code_name(s->code), s->msg);
    ck_assert_msg(!s->bad_seq, "%s: chunk sequence numbers not consecutive", what);
    ck_assert_msg(s->n_ids == s->want->n, "%s: %zu tokens, expected %zu (finish %s, usage %u)",
                  what, s->n_ids, s->want->n, river_finish_name(s->finish), s->completion);
    for (size_t i = 0; i < s->n_ids; i++)
        ck_assert_msg(s->ids[i] == s->want->ids[i], "%s: token %zu is %d, expected %d", what,
                      i, s->ids[i], s->want->ids[i]);
    ck_assert_msg(s->completion == s->n_ids, "%s: usage says %u tokens, got %zu", what,
                  s->completion, s->n_ids);
}

void streams_check_prefix(const streams_stream_t *s, const char *what)
{
    ck_assert_msg(s->ended, "%s: no end (silence)", what);
    ck_assert_msg(!s->bad_seq, "%s: chunk sequence numbers not consecutive", what);
    ck_assert_msg(s->n_ids <= s->want->n, "%s: %zu tokens, more than %zu", what, s->n_ids,
                  s->want->n);
    for (size_t i = 0; i < s->n_ids; i++)
        ck_assert_msg(s->ids[i] == s->want->ids[i], "%s: token %zu is %d, expected %d", what,
                      i, s->ids[i], s->want->ids[i]);
}

/* ---- Loads ---- */

/* One stream on a connection of its own; gives up (and leaves the stream without an end,
 * which streams_check reports as lost) after STREAMS_LIMIT_S. */
void *streams_job_run(void *arg)
{
    streams_job_t *j = arg;
    river_client_t *c;
    j->rc = river_client_new_secure(&c, j->endpoint, j->keys);
    if (j->rc < 0) {
        snprintf(j->err, sizeof j->err, "%s", river_err_detail());
        return NULL;
    }
    j->rc = river_client_submit(c, &j->opts, NULL, streams_on_event, j->st, NULL);
    double until = clock_now_s() + STREAMS_LIMIT_S;
    while (j->rc >= 0 && !j->st->ended && clock_now_s() < until)
        j->rc = river_client_poll(c, 100);
    if (j->rc < 0)
        snprintf(j->err, sizeof j->err, "%s", river_err_detail());
    river_client_destroy(&c);
    return NULL;
}

void streams_load_start(streams_load_t *l, const char *endpoint, const river_keys_t *keys,
                        int n, const streams_expect_t *want, int tokens, uint32_t timeout_ms)
{
    memset(l, 0, sizeof *l);
    l->n = n;
    l->st = calloc((size_t)n, sizeof *l->st);
    l->jobs = calloc((size_t)n, sizeof *l->jobs);
    l->th = calloc((size_t)n, sizeof *l->th);
    ck_assert(l->st && l->jobs && l->th);
    for (int i = 0; i < n; i++) {
        l->st[i].want = &want[i % STREAMS_N_PROMPTS];
        l->st[i].progress = &l->progress;
        river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
        o.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        o.max_tokens = (uint32_t)tokens;
        o.ignore_eos = 1;
        o.timeout_ms = timeout_ms;
        l->jobs[i] = (streams_job_t){.endpoint = endpoint, .keys = keys, .opts = o,
                                     .st = &l->st[i]};
        ck_assert_int_eq(pthread_create(&l->th[i], NULL, streams_job_run, &l->jobs[i]), 0);
    }
}

long streams_load_wait(streams_load_t *l, long tokens)
{
    double until = clock_now_s() + 30;
    while (atomic_load(&l->progress) < tokens && clock_now_s() < until)
        test_sleep_ms(2);
    return atomic_load(&l->progress);
}

int streams_load_finish(streams_load_t *l, const char *what)
{
    int complete = 0;
    for (int i = 0; i < l->n; i++)
        pthread_join(l->th[i], NULL);
    for (int i = 0; i < l->n; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s, stream %d", what, i);
        ck_assert_msg(l->jobs[i].rc >= 0, "%s: client library: %s", name, l->jobs[i].err);
        int ok = streams_check(&l->st[i], name);
        if (!ok)
            fprintf(stderr, "%s: %s after %zu tokens: %s\n", name,
                    river_code_name(l->st[i].code), l->st[i].n_ids, l->st[i].msg);
        complete += ok;
    }
    return complete;
}

void streams_load_free(streams_load_t *l)
{
    free(l->st);
    free(l->jobs);
    free(l->th);
    l->st = NULL;
    l->jobs = NULL;
    l->th = NULL;
}

static river_admin_t *streams__admin(const char *admin, const river_keys_t *keys)
{
    river_admin_t *a;
    int e = keys ? river_admin_new_secure(&a, admin, 2000, keys)
                 : river_admin_new(&a, admin, 2000);
    ck_assert_msg(e == 0, "admin %s: %s", admin, river_err_detail());
    return a;
}

void streams_wait_ready(const char *admin, const river_keys_t *keys, int n, int ms,
                        const char *dir)
{
    double until = clock_now_s() + ms / 1000.0;
    uint32_t ready = 0;
    while (clock_now_s() < until) {
        river_admin_t *a = streams__admin(admin, keys);
        river_status_t st;
        int rc = river_admin_status(a, &st);
        river_admin_destroy(&a);
        ready = rc == 0 ? st.workers_ready : 0;
        if (ready == (uint32_t)n)
            return;
        test_sleep_ms(20);
    }
    ck_assert_msg(0, "%u of %d workers ready after %d ms; see the logs in %s", ready, n, ms,
                  dir);
}

long streams_metric(const char *admin, const river_keys_t *keys, const char *name)
{
    river_admin_t *a = streams__admin(admin, keys);
    char *text;
    ck_assert_int_eq(river_admin_metrics(a, &text), 0);
    river_admin_destroy(&a);
    char pat[256];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr(text, pat);
    long v = -1;
    if (p)
        sscanf(p + strlen(pat), "%ld", &v);
    free(text);
    ck_assert_msg(v >= 0, "no metric %s", name);
    return v;
}
