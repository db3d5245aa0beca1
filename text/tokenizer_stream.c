/* Streaming decoder. It keeps a window of ids whose text may still change, decodes the window
 * on every push and hands out the part of the text that can no longer change.
 *
 * The window restarts after an id once everything decoded so far is final: no byte-fallback
 * piece waits for its neighbours, no incomplete UTF-8 character or strippable trailing
 * character is held back, and some text exists (so start-of-text rules, such as
 * SentencePiece's leading-space strip, have been applied). Later windows are decoded as
 * continuations of that text, so the pieces concatenate to exactly tokenizer_decode of all
 * ids, and each push costs time proportional to the window, not to the whole sequence. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

struct tok_stream {
    const tokenizer_t *t;
    int skip_special;
    tok_ids_t win;   /* ids of the current window */
    int32_t prev_id; /* the id before the window, -1 at the start */
    int cont;        /* text before the window is non-empty */
    size_t emitted;  /* bytes of the window's text already handed out */
    tok_buf_t text;  /* scratch: the window's decoded text */
    tok_buf_t piece; /* what the last call handed out */
};

int tok_stream_new(tok_stream_t **out, const tokenizer_t *t, int skip_special)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "tok_stream_new: no output pointer");
    *out = NULL;
    if (!t)
        return river_err_set(RIVER_EINVAL, "tok_stream_new: no tokenizer");
    tok_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return river_err_set(RIVER_ENOMEM, "%s: no memory for a decode stream", t->path);
    s->t = t;
    s->skip_special = skip_special;
    s->prev_id = -1;
    *out = s;
    return 0;
}

void tok_stream_destroy(tok_stream_t **sp)
{
    if (!sp || !*sp)
        return;
    tok_stream_t *s = *sp;
    tok_ids_free(&s->win);
    tok_buf_free(&s->text);
    tok_buf_free(&s->piece);
    free(s);
    *sp = NULL;
}

/* Copies text[from..to) into the piece buffer and points the caller at it. */
static int stream_emit(tok_stream_t *s, size_t from, size_t to, const char **piece, size_t *len)
{
    s->piece.len = 0;
    if (to > from && tok_buf_put(&s->piece, s->text.p + from, to - from))
        return river_err_set(RIVER_ENOMEM, "%s: no memory in the decode stream", s->t->path);
    if (tok_buf_reserve(&s->piece, 0))
        return river_err_set(RIVER_ENOMEM, "%s: no memory in the decode stream", s->t->path);
    s->piece.p[s->piece.len] = '\0';
    *piece = s->piece.p;
    *len = s->piece.len;
    return 0;
}

/* Starts a new window after the current one, whose text is all handed out. */
static void stream_restart(tok_stream_t *s)
{
    if (s->text.len > 0)
        s->cont = 1;
    if (s->win.len > 0)
        s->prev_id = s->win.p[s->win.len - 1];
    s->win.len = 0;
    s->emitted = 0;
}

int tok_stream_push(tok_stream_t *s, int32_t id, const char **piece, size_t *len)
{
    if (!s || !piece || !len)
        return river_err_set(RIVER_EINVAL, "tok_stream_push: invalid argument");
    *piece = "";
    *len = 0;
    const tokenizer_t *t = s->t;
    if (!tok_id_valid(t, id))
        return river_err_set(RIVER_ERANGE, "%s: token id %d is out of range (vocabulary of %d)",
                             t->path, (int)id, t->vocab_size);
    if (tok_ids_push(&s->win, id))
        return river_err_set(RIVER_ENOMEM, "%s: no memory in the decode stream", t->path);

    /* Ids at the end that the decoder may still join with what follows contribute nothing
     * final yet: decode the window without them. */
    size_t k = s->win.len;
    while (k > 0 && tok_is_pending(t, s->win.p[k - 1], s->skip_special))
        k--;

    s->text.len = 0;
    tok_window_t w = {.cont = s->cont, .open_end = 1, .prev_id = s->prev_id, .hold = 0};
    int err = tok_decode_window(t, s->win.p, k, s->skip_special, &w, &s->text);
    if (err) {
        s->win.len--;
        return err;
    }
    size_t stable = w.hold < s->text.len ? s->text.len - w.hold : 0;
    size_t from = s->emitted;
    err = stream_emit(s, from, stable > from ? stable : from, piece, len);
    if (err)
        return err;
    if (stable > s->emitted)
        s->emitted = stable;
    if (k == s->win.len && w.hold == 0 && (s->cont || s->text.len > 0))
        stream_restart(s);
    return 0;
}

int tok_stream_finish(tok_stream_t *s, const char **piece, size_t *len)
{
    if (!s || !piece || !len)
        return river_err_set(RIVER_EINVAL, "tok_stream_finish: invalid argument");
    *piece = "";
    *len = 0;
    s->text.len = 0;
    tok_window_t w = {.cont = s->cont, .open_end = 0, .prev_id = s->prev_id, .hold = 0};
    int err = tok_decode_window(s->t, s->win.p, s->win.len, s->skip_special, &w, &s->text);
    if (err)
        return err;
    size_t from = s->emitted < s->text.len ? s->emitted : s->text.len;
    err = stream_emit(s, from, s->text.len, piece, len);
    if (err)
        return err;
    stream_restart(s);
    return 0;
}
