/* Tokenizer tests: every reference case of the four tokenizer.json files (ids, ids with
 * special tokens, decoded text, made by Hugging Face `tokenizers` 0.22), the llama2.c golden
 * prompts of both tok*.bin files, the streaming decoder, malformed files and bad ids. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "text/tokenizer.h"
#include "tests/testutil.h"

#define TOK_DIR TEST_DATA "/tokenizers"

static const char *const hf_names[] = {"qwen3", "llama3", "mistral-7b", "tinystories-656k"};
#define N_HF (int)(sizeof hf_names / sizeof hf_names[0])

static tokenizer_t *load_ok(const char *path, int hint)
{
    tokenizer_t *t = NULL;
    int err = tokenizer_load(&t, path, hint);
    ck_assert_msg(err == 0, "loading %s failed: %s: %s", path, river_strerror(err),
                  river_err_detail());
    ck_assert_ptr_nonnull(t);
    return t;
}

static tokenizer_t *load_hf(int i)
{
    char path[256];
    snprintf(path, sizeof path, TOK_DIR "/%s/tokenizer.json", hf_names[i]);
    return load_ok(path, 0);
}

/* Strict UTF-8 check, independent of the library's own. */
static int utf8_ok(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return 0;
        }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n)
                return 0;
            unsigned b = u[i + j];
            if (b < lo || b > hi)
                return 0;
            lo = 0x80;
            hi = 0xBF;
        }
        i += k + 1;
    }
    return 1;
}

static int ids_match(const json_t *arr, const int32_t *ids, size_t n)
{
    if (!json_is_array(arr) || json_array_size(arr) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != ids[i])
            return 0;
    return 1;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 64; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

static int32_t *json_ids(const json_t *arr, size_t *n)
{
    *n = json_array_size(arr);
    int32_t *v = malloc((*n ? *n : 1) * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

/* Streams ids through a decoder and checks that the pieces are whole UTF-8 and concatenate
 * to tokenizer_decode. Returns how many pushes gave nothing (text held back). */
static int check_stream(const tokenizer_t *t, const int32_t *ids, size_t n, int skip,
                        const char *what)
{
    char *want = NULL;
    size_t want_len = 0;
    int err = tokenizer_decode(t, ids, n, skip, &want, &want_len);
    ck_assert_msg(err == 0, "%s: decode failed: %s", what, river_err_detail());
    tok_stream_t *s = NULL;
    ck_assert_int_eq(tok_stream_new(&s, t, skip), 0);
    char *got = malloc(want_len + 1);
    ck_assert_ptr_nonnull(got);
    size_t got_len = 0;
    int held = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t len;
        err = i < n ? tok_stream_push(s, ids[i], &piece, &len) : tok_stream_finish(s, &piece, &len);
        ck_assert_msg(err == 0, "%s: stream failed at id %zu: %s", what, i, river_err_detail());
        ck_assert_msg(utf8_ok(piece, len), "%s: stream piece %zu is not whole UTF-8", what, i);
        ck_assert_msg(got_len + len <= want_len && memcmp(want + got_len, piece, len) == 0,
                      "%s: stream piece %zu ('%.*s') is not the next part of '%s'", what, i,
                      (int)len, piece, want);
        memcpy(got + got_len, piece, len);
        got_len += len;
        if (i < n && len == 0)
            held++;
    }
    ck_assert_msg(got_len == want_len, "%s: stream gave %zu bytes, decode %zu ('%.*s' vs '%s')",
                  what, got_len, want_len, (int)got_len, got, want);
    tok_stream_destroy(&s);
    ck_assert_ptr_null(s);
    free(got);
    free(want);
    return held;
}

/* ---- every reference case ---------------------------------------------------------------- */

START_TEST(test_hf_cases)
{
    const char *name = hf_names[_i];
    tokenizer_t *t = load_hf(_i);
    char path[256];
    snprintf(path, sizeof path, TOK_DIR "/%s/cases.jsonl", name);
    size_t flen;
    char *data = test_read_file(path, &flen);
    ck_assert_msg(data != NULL, "cannot read %s", path);

    int n_cases = 0, n_bad = 0;
    char first_bad[512] = "";
    for (char *line = data, *end; *line; line = end) {
        end = strchr(line, '\n');
        end = end ? end + 1 : line + strlen(line);
        if (end - line <= 1)
            continue;
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)(end - line), 0, &je);
        ck_assert_msg(c != NULL, "%s: line %d: %s", path, n_cases + 1, je.text);
        json_t *jt = json_object_get(c, "text");
        const char *text = json_string_value(jt);
        size_t tlen = json_string_length(jt);
        json_t *want_ids = json_object_get(c, "ids");
        json_t *want_sp = json_object_get(c, "ids_with_special");
        json_t *want_dec = json_object_get(c, "decoded");
        ck_assert(text && json_is_array(want_ids) && json_is_array(want_sp) &&
                  json_is_string(want_dec));

        int32_t *ids = NULL, *ids_sp = NULL;
        size_t n = 0, n_sp = 0;
        ck_assert_msg(tokenizer_encode(t, text, tlen, 0, &ids, &n) == 0, "%s case %d: %s", name,
                      n_cases, river_err_detail());
        ck_assert_msg(tokenizer_encode(t, text, tlen, 1, &ids_sp, &n_sp) == 0, "%s case %d: %s",
                      name, n_cases, river_err_detail());
        size_t nref;
        int32_t *ref = json_ids(want_ids, &nref);
        char *dec = NULL;
        size_t dlen = 0;
        ck_assert_msg(tokenizer_decode(t, ref, nref, 0, &dec, &dlen) == 0, "%s case %d: %s", name,
                      n_cases, river_err_detail());
        int ok_ids = ids_match(want_ids, ids, n);
        int ok_sp = ids_match(want_sp, ids_sp, n_sp);
        int ok_dec = dlen == json_string_length(want_dec) &&
                     memcmp(dec, json_string_value(want_dec), dlen) == 0;
        if (!ok_ids || !ok_sp || !ok_dec) {
            n_bad++;
            fprintf(stderr, "%s case %d %s%s%s: text '%s'\n", name, n_cases, ok_ids ? "" : "[ids]",
                    ok_sp ? "" : "[ids_with_special]", ok_dec ? "" : "[decoded]", text);
            if (!ok_ids) {
                print_ids("got ", ids, n);
                print_ids("want", ref, nref);
            }
            if (!ok_dec)
                fprintf(stderr, "    decoded '%s', want '%s'\n", dec, json_string_value(want_dec));
            if (!first_bad[0])
                snprintf(first_bad, sizeof first_bad, "case %d, text '%s'", n_cases, text);
        }
        /* The stream agrees with decode on the reference ids, with and without specials. */
        char what[64];
        snprintf(what, sizeof what, "%s case %d", name, n_cases);
        check_stream(t, ref, nref, 0, what);
        check_stream(t, ids_sp, n_sp, 1, what);
        free(ids);
        free(ids_sp);
        free(ref);
        free(dec);
        json_decref(c);
        n_cases++;
    }
    free(data);
    ck_assert_int_eq(n_cases, 99);
    ck_assert_msg(n_bad == 0, "%s: %d of %d cases differ from the reference; first: %s", name,
                  n_bad, n_cases, first_bad);
    tokenizer_destroy(&t);
    ck_assert_ptr_null(t);
}
END_TEST

/* ---- special ids ------------------------------------------------------------------------- */

START_TEST(test_hf_special_ids)
{
    /* bos, eos, vocabulary size (model vocab plus added tokens), one special, one not */
    static const int want[N_HF][5] = {
        {-1, 151645, 151669, 151643, 9707},
        {128000, 128001, 128256, 128000, 9906},
        {1, 2, 32000, 2, 22557},
        {1, 2, 2048, 0, 80},
    };
    tokenizer_t *t = load_hf(_i);
    ck_assert_int_eq(tokenizer_bos_id(t), want[_i][0]);
    ck_assert_int_eq(tokenizer_eos_id(t), want[_i][1]);
    ck_assert_int_eq(tokenizer_vocab_size(t), want[_i][2]);
    ck_assert(tokenizer_is_special(t, want[_i][3]));
    ck_assert(!tokenizer_is_special(t, want[_i][4]));
    ck_assert(!tokenizer_is_special(t, -1));
    ck_assert(!tokenizer_is_special(t, want[_i][2]));
    tokenizer_destroy(&t);
}
END_TEST

START_TEST(test_hf_skip_special)
{
    /* mistral-7b: <s> ▁Hello </s> */
    tokenizer_t *t = load_hf(2);
    int32_t ids[] = {1, 22557, 2};
    char *s = NULL;
    size_t n;
    ck_assert_int_eq(tokenizer_decode(t, ids, 3, 1, &s, &n), 0);
    ck_assert_str_eq(s, "Hello");
    ck_assert_uint_eq(n, 5);
    free(s);
    ck_assert_int_eq(tokenizer_decode(t, ids, 3, 0, &s, &n), 0);
    ck_assert_str_eq(s, "<s> Hello</s>");
    free(s);
    tokenizer_destroy(&t);
}
END_TEST

/* llama3 sets ignore_merges: a pre-token that is a vocabulary entry is one token even where
 * the merges would split it (" việc" would merge to " vi" "ệ" "c"). */
START_TEST(test_hf_ignore_merges)
{
    static const struct {
        const char *text;
        int32_t id;
    } whole[] = {{" vi\xE1\xBB\x87"
                  "c",
                  100769},
                 {"mektedir", 102909},
                 {".:.:.:.:.:.:.:.:", 105356}};
    tokenizer_t *t = load_hf(1);
    for (int i = 0; i < 3; i++) {
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(tokenizer_encode(t, whole[i].text, strlen(whole[i].text), 0, &ids, &n), 0);
        ck_assert_msg(n == 1 && ids[0] == whole[i].id, "'%s' gave %zu tokens, first %d",
                      whole[i].text, n, n ? (int)ids[0] : -1);
        free(ids);
    }
    tokenizer_destroy(&t);
}
END_TEST

/* A directory stands for its tokenizer.json. */
START_TEST(test_load_directory)
{
    tokenizer_t *t = load_ok(TOK_DIR "/mistral-7b", 0);
    ck_assert_int_eq(tokenizer_vocab_size(t), 32000);
    tokenizer_destroy(&t);
    t = load_ok(TOK_DIR "/mistral-7b/", 0);
    tokenizer_destroy(&t);
    int err = tokenizer_load(&t, TOK_DIR, 0);
    ck_assert_int_eq(err, RIVER_ENOTFOUND);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "tokenizer.json"));
}
END_TEST

/* ---- llama2.c ---------------------------------------------------------------------------- */

static const struct {
    const char *dir, *tok;
    int vocab;
} l2c[] = {
    {TEST_DATA "/stories260K", TEST_DATA "/stories260K/tok512.bin", 512},
    {TEST_DATA "/tinystories-656k", TEST_DATA "/tinystories-656k/llama2c/tok2048.bin", 2048},
};

START_TEST(test_l2c_golden)
{
    tokenizer_t *t = load_ok(l2c[_i].tok, l2c[_i].vocab);
    ck_assert_int_eq(tokenizer_vocab_size(t), l2c[_i].vocab);
    ck_assert_int_eq(tokenizer_bos_id(t), 1);
    ck_assert_int_eq(tokenizer_eos_id(t), 2);
    /* A hint of 0 derives the size from the file. */
    tokenizer_t *t0 = load_ok(l2c[_i].tok, 0);
    ck_assert_int_eq(tokenizer_vocab_size(t0), l2c[_i].vocab);
    tokenizer_destroy(&t0);

    char path[512];
    snprintf(path, sizeof path, "%s/golden/index.json", l2c[_i].dir);
    json_error_t je;
    json_t *index = json_load_file(path, 0, &je);
    ck_assert_msg(index != NULL, "%s: %s", path, je.text);
    json_t *prompts = json_object_get(index, "prompts");
    ck_assert_int_eq((int)json_array_size(prompts), 3);
    for (size_t p = 0; p < json_array_size(prompts); p++) {
        json_t *entry = json_array_get(prompts, p);
        const char *prompt = json_string_value(json_object_get(entry, "prompt"));
        const char *file = json_string_value(json_object_get(entry, "json"));
        ck_assert(prompt && file);
        snprintf(path, sizeof path, "%s/golden/%s", l2c[_i].dir, file);
        json_t *g = json_load_file(path, 0, &je);
        ck_assert_msg(g != NULL, "%s: %s", path, je.text);

        int32_t *ids;
        size_t n;
        ck_assert_int_eq(tokenizer_encode(t, prompt, strlen(prompt), 1, &ids, &n), 0);
        json_t *want = json_object_get(g, "prompt_tokens");
        if (!ids_match(want, ids, n)) {
            size_t nw;
            int32_t *w = json_ids(want, &nw);
            print_ids("got ", ids, n);
            print_ids("want", w, nw);
            free(w);
            ck_abort_msg("%s: prompt '%s' encodes differently from run.c", l2c[_i].tok, prompt);
        }
        free(ids);

        /* Without BOS the dummy prefix still comes first. */
        ck_assert_int_eq(tokenizer_encode(t, prompt, strlen(prompt), 0, &ids, &n), 0);
        ck_assert_uint_eq(n, json_array_size(want) - 1);
        ck_assert_int_eq(ids[0], json_integer_value(json_array_get(want, 1)));
        free(ids);

        /* The whole sequence decodes to run.c's output (prompt echo, then the generated
         * text; run.c prints a final newline). */
        size_t nseq;
        int32_t *seq = json_ids(json_object_get(g, "full_sequence"), &nseq);
        char *text;
        size_t tlen;
        ck_assert_int_eq(tokenizer_decode(t, seq, nseq, 1, &text, &tlen), 0);
        char txt_path[512];
        snprintf(txt_path, sizeof txt_path, "%s", path);
        strcpy(strrchr(txt_path, '.'), ".txt");
        size_t ref_len;
        char *ref = test_read_file(txt_path, &ref_len);
        ck_assert_msg(ref != NULL, "cannot read %s", txt_path);
        ck_assert_msg(ref_len == tlen + 1 && memcmp(ref, text, tlen) == 0 && ref[tlen] == '\n',
                      "%s: decoded '%s' differs from run.c's '%s'", txt_path, text, ref);
        free(ref);
        free(text);
        check_stream(t, seq, nseq, 0, "llama2.c golden");
        check_stream(t, seq, nseq, 1, "llama2.c golden");
        free(seq);
        json_decref(g);
    }
    json_decref(index);

    /* run.c: no dummy prefix for empty text. */
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tokenizer_encode(t, "", 0, 1, &ids, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ids[0], 1);
    free(ids);
    ck_assert_int_eq(tokenizer_encode(t, "", 0, 0, &ids, &n), 0);
    ck_assert_uint_eq(n, 0);
    free(ids);
    tokenizer_destroy(&t);
}
END_TEST

/* The Hugging Face copy of the TinyStories tokenizer agrees with the llama2.c export on the
 * golden prompts (their README records the library's ids). */
START_TEST(test_hf_tinystories_golden)
{
    tokenizer_t *t = load_ok(TEST_DATA "/tinystories-656k/tokenizer.json", 0);
    static const char *files[] = {"once_upon_a_time", "tom_and_lily", "the_dog"};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, TEST_DATA "/tinystories-656k/golden/%s.json", files[i]);
        json_error_t je;
        json_t *g = json_load_file(path, 0, &je);
        ck_assert_msg(g != NULL, "%s: %s", path, je.text);
        const char *prompt = json_string_value(json_object_get(g, "prompt"));
        ck_assert_ptr_nonnull(prompt);
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(tokenizer_encode(t, prompt, strlen(prompt), 1, &ids, &n), 0);
        ck_assert_msg(ids_match(json_object_get(g, "prompt_tokens"), ids, n), "%s", path);
        free(ids);
        json_decref(g);
    }
    tokenizer_destroy(&t);
}
END_TEST

/* Characters outside a llama2.c vocabulary fall back to byte + 3, as in run.c. */
START_TEST(test_l2c_byte_fallback)
{
    tokenizer_t *t = load_ok(l2c[0].tok, 512);
    const char *text = "\xE4\xBD\xA0"; /* 你, not in tok512 */
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tokenizer_encode(t, text, 3, 0, &ids, &n), 0);
    /* " " then <0xE4> <0xBD> <0xA0>, which no merge joins */
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(ids[1], 0xE4 + 3);
    ck_assert_int_eq(ids[2], 0xBD + 3);
    ck_assert_int_eq(ids[3], 0xA0 + 3);
    char *s;
    size_t len;
    ck_assert_int_eq(tokenizer_decode(t, ids, n, 0, &s, &len), 0);
    ck_assert_str_eq(s, " \xE4\xBD\xA0");
    free(s);
    ck_assert_int_eq(check_stream(t, ids, n, 0, "tok512 byte fallback"), 2);
    free(ids);
    tokenizer_destroy(&t);
}
END_TEST

/* Equal scores: run.c merges the leftmost pair first. Expected ids from a plain
 * re-implementation of run.c's quadratic loop. */
START_TEST(test_l2c_ties)
{
    static const char mixed[] = "Look, ooo! The cat said \"mmm\" 1234 caf\xC3\xA9 "
                                "\xE4\xBD\xA0\xE5\xA5\xBD";
    static const struct {
        int tok;
        const char *text;
        int32_t ids[40];
        size_t n;
    } cases[] = {
        {1, "ooo", {1, 80, 1956, 67}, 4},
        {1, "ooooo", {1, 80, 1956, 1956, 67}, 5},
        {1, "lll", {1, 80, 113, 64}, 4},
        {1,
         mixed,
         {1,  80, 1680, 1956, 67,  1025, 411, 2031, 65,  65,   65,  153, 12,
          13, 14, 15,   80,   295, 58,   198, 172,  277, 2035, 232, 168, 192},
         26},
        {0, "ooooo", {1, 334, 347, 347}, 4},
        {0,
         mixed,
         {1,   307, 347, 433, 432, 334, 347, 443, 291, 280, 294, 336, 313, 423, 423, 423, 436,
          410, 475, 479, 472, 484, 280, 412, 431, 485, 410, 231, 192, 163, 232, 168, 192},
         33},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tokenizer_t *t = load_ok(l2c[cases[c].tok].tok, 0);
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(tokenizer_encode(t, cases[c].text, strlen(cases[c].text), 1, &ids, &n), 0);
        int same = n == cases[c].n && memcmp(ids, cases[c].ids, n * sizeof *ids) == 0;
        if (!same) {
            print_ids("got ", ids, n);
            print_ids("want", cases[c].ids, cases[c].n);
        }
        ck_assert_msg(same, "%s: '%s' encodes differently from run.c", l2c[cases[c].tok].tok,
                      cases[c].text);
        free(ids);
        tokenizer_destroy(&t);
    }
}
END_TEST

/* ---- streaming ----------------------------------------------------------------------------- */

static const char multi[] = "Hi \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C "
                            "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD\xF0\x9F\x87\xBA"
                            "\xF0\x9F\x87\xB8 \xEC\x95\x88\xEB\x85\x95\xED\x95\x98\xEC\x84\xB8"
                            "\xEC\x9A\x94 pizza \xF0\x9F\x8D\x95! caf\xC3\xA9\n\tend";

START_TEST(test_stream_multibyte)
{
    /* Byte-level (llama3) and byte-fallback (mistral) tokens split characters: the stream
     * must hold those pushes back. */
    static const int must_hold[N_HF] = {0, 1, 1, 0};
    tokenizer_t *t = load_hf(_i);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tokenizer_encode(t, multi, sizeof multi - 1, 1, &ids, &n), 0);
    char what[64];
    snprintf(what, sizeof what, "%s multibyte", hf_names[_i]);
    int held = check_stream(t, ids, n, 0, what);
    check_stream(t, ids, n, 1, what);
    if (must_hold[_i])
        ck_assert_msg(held > 0, "%s: no token split a character", what);
    /* Round trip (tinystories lacks these characters and decodes <unk>). */
    char *s;
    size_t len;
    ck_assert_int_eq(tokenizer_decode(t, ids, n, 1, &s, &len), 0);
    if (_i != 3)
        ck_assert_str_eq(s, multi);
    free(s);
    free(ids);
    tokenizer_destroy(&t);
}
END_TEST

/* A truncated byte sequence at the end comes out of finish() as U+FFFD, as decode does. */
START_TEST(test_stream_incomplete_tail)
{
    tokenizer_t *t = load_hf(2);
    int32_t ids[] = {22557, 28705, 0xF0 + 3, 0x9F + 3}; /* ▁Hello ▁ <0xF0> <0x9F> */
    char *s;
    size_t len;
    ck_assert_int_eq(tokenizer_decode(t, ids, 4, 0, &s, &len), 0);
    ck_assert_str_eq(s, "Hello \xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    ck_assert_int_eq(check_stream(t, ids, 4, 0, "mistral incomplete"), 2);
    tokenizer_destroy(&t);

    /* Byte-level: the first byte of an emoji alone. */
    t = load_hf(1);
    int32_t bl[] = {9906, 76460}; /* Hello, 'ðŁĺ' (F0 9F 98) */
    ck_assert_int_eq(tokenizer_decode(t, bl, 2, 0, &s, &len), 0);
    ck_assert_str_eq(s, "Hello\xEF\xBF\xBD");
    free(s);
    ck_assert_int_eq(check_stream(t, bl, 2, 0, "llama3 incomplete"), 1);
    tokenizer_destroy(&t);
}
END_TEST

/* Random id sequences, rich in byte pieces and special tokens: the stream always agrees
 * with decode, with and without skipping specials. */
START_TEST(test_stream_random)
{
    tokenizer_t *t = _i < N_HF ? load_hf(_i) : load_ok(l2c[_i - N_HF].tok, 0);
    int v = tokenizer_vocab_size(t);
    unsigned seed = 777u + (unsigned)_i;
    int32_t ids[64];
    for (int round = 0; round < 300; round++) {
        for (int k = 0; k < 64; k++) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = seed >> 8;
            int pick = (int)(r % 8);
            if (pick < 4)
                ids[k] = (int32_t)(r % 259); /* specials and byte pieces sit low */
            else if (pick == 4)
                ids[k] = (int32_t)(v - 1 - (int)(r % 30)); /* added tokens sit high */
            else
                ids[k] = (int32_t)(r % (unsigned)v);
        }
        int n = 1 + (int)((seed >> 4) % 64);
        char what[64];
        snprintf(what, sizeof what, "tokenizer %d random round %d", _i, round);
        check_stream(t, ids, (size_t)n, 0, what);
        check_stream(t, ids, (size_t)n, 1, what);
    }
    tokenizer_destroy(&t);
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------ */

START_TEST(test_bad_ids)
{
    tokenizer_t *t;
    if (_i < N_HF)
        t = load_hf(_i);
    else
        t = load_ok(l2c[_i - N_HF].tok, 0);
    int v = tokenizer_vocab_size(t);
    int32_t bad[] = {v, -1, 1 << 30};
    for (int k = 0; k < 3; k++) {
        int32_t ids[] = {1, bad[k], 2};
        char *s = (char *)1;
        size_t len;
        ck_assert_int_eq(tokenizer_decode(t, ids, 3, 0, &s, &len), RIVER_ERANGE);
        ck_assert_ptr_null(s);
        ck_assert_ptr_nonnull(strstr(river_err_detail(), "out of range"));
        tok_stream_t *st;
        ck_assert_int_eq(tok_stream_new(&st, t, 0), 0);
        const char *piece;
        ck_assert_int_eq(tok_stream_push(st, bad[k], &piece, &len), RIVER_ERANGE);
        ck_assert_int_eq(tok_stream_push(st, 3, &piece, &len), 0);
        tok_stream_destroy(&st);
    }
    tokenizer_destroy(&t);
}
END_TEST

START_TEST(test_invalid_utf8)
{
    tokenizer_t *t = load_hf(0);
    int32_t *ids = (int32_t *)1;
    size_t n;
    ck_assert_int_eq(tokenizer_encode(t, "ab\xC3(", 4, 0, &ids, &n), RIVER_EINVAL);
    ck_assert_ptr_null(ids);
    tokenizer_destroy(&t);
}
END_TEST

/* Writes data to a temporary file and checks that loading it fails with err and a detail
 * naming the file and containing `needle`. */
static void expect_load_error(const char *name, const void *data, size_t len, int hint, int err,
                              const char *needle)
{
    const char *path = test_write_tmp(name, data, len);
    ck_assert_ptr_nonnull(path);
    char saved[512];
    snprintf(saved, sizeof saved, "%s", path);
    tokenizer_t *t = (tokenizer_t *)1;
    int got = tokenizer_load(&t, saved, hint);
    ck_assert_msg(got == err, "%s: got %s (%s), want %s", name, river_err_name(got),
                  river_err_detail(), river_err_name(err));
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(river_err_detail(), saved) != NULL,
                  "%s: detail '%s' does not name the file", name, river_err_detail());
    ck_assert_msg(strstr(river_err_detail(), needle) != NULL, "%s: detail '%s' lacks '%s'", name,
                  river_err_detail(), needle);
}

START_TEST(test_malformed)
{
    size_t len;
    char *bin = test_read_file(l2c[0].tok, &len);
    ck_assert_ptr_nonnull(bin);
    expect_load_error("cut.bin", bin, len - 3, 0, RIVER_ETRUNC, "truncated");
    expect_load_error("cut-header.bin", bin, 2, 0, RIVER_ETRUNC, "truncated");
    expect_load_error("cut-record.bin", bin, 4 + 5, 0, RIVER_ETRUNC, "truncated");
    expect_load_error("hint.bin", bin, len, 1000, RIVER_EFORMAT, "1000");
    /* A record length beyond max_token_length. */
    char *bad = malloc(len);
    ck_assert_ptr_nonnull(bad);
    memcpy(bad, bin, len);
    bad[4 + 4] = 100;
    expect_load_error("badlen.bin", bad, len, 0, RIVER_EFORMAT, "length");
    free(bad);
    free(bin);

    expect_load_error("empty.json", "", 0, 0, RIVER_EFORMAT, "empty");
    const char *s = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}";
    expect_load_error("cut.json", s, strlen(s), 0, RIVER_EFORMAT, "invalid JSON");
    s = "{\"version\": \"1.0\"}";
    expect_load_error("nomodel.json", s, strlen(s), 0, RIVER_EFORMAT, "model");
    s = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}";
    expect_load_error("wordpiece.json", s, strlen(s), 0, RIVER_EUNSUPPORTED, "WordPiece");
    s = "{\"model\": {\"type\": \"BPE\", \"merges\": []}}";
    expect_load_error("novocab.json", s, strlen(s), 0, RIVER_EFORMAT, "vocab");
    s = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}";
    expect_load_error("badmerge.json", s, strlen(s), 0, RIVER_EFORMAT, "\"b\"");
    s = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}";
    expect_load_error("badid.json", s, strlen(s), 0, RIVER_EFORMAT, "bad id");
    s = "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}";
    expect_load_error("emptyvocab.json", s, strlen(s), 0, RIVER_EFORMAT, "empty");
    s = "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
        "\"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}";
    expect_load_error("badregex.json", s, strlen(s), 0, RIVER_EFORMAT, "regex");
    s = "{\"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}, \"model\": {\"type\": \"BPE\", "
        "\"vocab\": {\"a\": 0}}}";
    expect_load_error("badpre.json", s, strlen(s), 0, RIVER_EUNSUPPORTED, "UnicodeScripts");
    s = "[1, 2, 3]";
    expect_load_error("array.json", s, strlen(s), 0, RIVER_EFORMAT, "neither");

    tokenizer_t *t = (tokenizer_t *)1;
    ck_assert_int_eq(tokenizer_load(&t, "/nonexistent/tokenizer.json", 0), RIVER_ENOTFOUND);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "/nonexistent/tokenizer.json"));
}
END_TEST

/* Garbage never crashes the loader: every prefix of a real file and some noise. */
START_TEST(test_garbage)
{
    size_t len;
    char *bin = test_read_file(l2c[0].tok, &len);
    ck_assert_ptr_nonnull(bin);
    for (size_t cut = 0; cut < len; cut += 97) {
        const char *path = test_write_tmp("prefix.bin", bin, cut);
        tokenizer_t *t = NULL;
        int err = tokenizer_load(&t, path, 512);
        ck_assert_int_ne(err, 0);
        ck_assert_ptr_null(t);
    }
    free(bin);
    char *json = test_read_file(TOK_DIR "/tinystories-656k/tokenizer.json", &len);
    ck_assert_ptr_nonnull(json);
    for (size_t cut = 1; cut < len; cut += 4093) {
        const char *path = test_write_tmp("prefix.json", json, cut);
        tokenizer_t *t = NULL;
        ck_assert_int_ne(tokenizer_load(&t, path, 0), 0);
        ck_assert_ptr_null(t);
    }
    free(json);
    unsigned seed = 12345;
    char noise[4096];
    for (int round = 0; round < 50; round++) {
        for (size_t i = 0; i < sizeof noise; i++) {
            seed = seed * 1103515245u + 12345u;
            noise[i] = (char)(seed >> 16);
        }
        const char *path = test_write_tmp("noise.bin", noise, sizeof noise);
        tokenizer_t *t = NULL;
        if (tokenizer_load(&t, path, 0) == 0) {
            /* Noise can parse as a llama2.c file; it must then work. */
            int32_t *ids;
            size_t n;
            ck_assert_int_eq(tokenizer_encode(t, "hello", 5, 1, &ids, &n), 0);
            free(ids);
            tokenizer_destroy(&t);
        }
    }
}
END_TEST

/* ---- features the four files do not use --------------------------------------------------- */

START_TEST(test_metaspace_and_added_flags)
{
    const char *s =
        "{\"added_tokens\": ["
        "{\"id\": 7, \"content\": \"<mask>\", \"single_word\": false, \"lstrip\": true, "
        "\"rstrip\": true, \"normalized\": false, \"special\": true},"
        "{\"id\": 8, \"content\": \"cat\", \"single_word\": true, \"lstrip\": false, "
        "\"rstrip\": false, \"normalized\": false, \"special\": false},"
        "{\"id\": 5, \"content\": \"<s>\", \"special\": true},"
        "{\"id\": 6, \"content\": \"</s>\", \"special\": true}],"
        "\"normalizer\": null,"
        "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", "
        "\"prepend_scheme\": \"first\", \"split\": true},"
        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
        "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
        "\"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}], "
        "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [5], \"tokens\": [\"<s>\"]}, "
        "\"</s>\": {\"id\": \"</s>\", \"ids\": [6], \"tokens\": [\"</s>\"]}}},"
        "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", "
        "\"prepend_scheme\": \"first\", \"split\": true},"
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\u2581\": 0, \"a\": 1, \"b\": 2, "
        "\"\\u2581a\": 3, \"\\u2581ab\": 4, \"<s>\": 5, \"</s>\": 6, \"c\": 9, \"t\": 10}, "
        "\"merges\": [\"\\u2581 a\", \"\\u2581a b\"]}}";
    const char *path = test_write_tmp("meta.json", s, strlen(s));
    ck_assert_ptr_nonnull(path);
    tokenizer_t *t = load_ok(path, 0);
    ck_assert_int_eq(tokenizer_vocab_size(t), 11);
    ck_assert_int_eq(tokenizer_bos_id(t), 5);
    ck_assert_int_eq(tokenizer_eos_id(t), 6);
    int32_t *ids;
    size_t n;
    /* "ab ab": prepended ▁ (first), split before each ▁: [▁ab, ▁ab] */
    ck_assert_int_eq(tokenizer_encode(t, "ab ab", 5, 1, &ids, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(ids[0], 5);
    ck_assert_int_eq(ids[1], 4);
    ck_assert_int_eq(ids[2], 4);
    ck_assert_int_eq(ids[3], 6);
    char *txt;
    size_t len;
    ck_assert_int_eq(tokenizer_decode(t, ids, n, 1, &txt, &len), 0);
    ck_assert_str_eq(txt, "ab ab");
    free(txt);
    free(ids);
    /* lstrip/rstrip take the spaces around <mask>; the part after it is not at the start,
     * so no ▁ is prepended there. */
    ck_assert_int_eq(tokenizer_encode(t, "a  <mask>  b", 12, 0, &ids, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(ids[0], 3);
    ck_assert_int_eq(ids[1], 7);
    ck_assert_int_eq(ids[2], 2);
    free(ids);
    /* single_word: "cat" only as a whole word. */
    ck_assert_int_eq(tokenizer_encode(t, "cat", 3, 0, &ids, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ids[0], 8);
    free(ids);
    ck_assert_int_eq(tokenizer_encode(t, "acat", 4, 0, &ids, &n), 0);
    ck_assert_uint_eq(n, 4); /* ▁a c a t */
    ck_assert_int_eq(ids[0], 3);
    ck_assert_int_eq(ids[1], 9);
    free(ids);
    tokenizer_destroy(&t);
}
END_TEST

/* ---- speed ------------------------------------------------------------------------------- */

START_TEST(test_speed)
{
    static const int big[] = {0, 1};
    for (int k = 0; k < 2; k++) {
        double t0 = clock_now_s();
        tokenizer_t *t = load_hf(big[k]);
        double load = clock_now_s() - t0;
        fprintf(stderr, "load %s: %.3f s\n", hf_names[big[k]], load);
        ck_assert_msg(load < 3.0, "%s took %.2f s to load", hf_names[big[k]], load);
        tokenizer_destroy(&t);
    }
    /* Long inputs: one 200,000-letter word (a single pre-token) and ~1 MB of mixed text. */
    size_t n_a = 200000;
    char *aaa = malloc(n_a);
    ck_assert_ptr_nonnull(aaa);
    memset(aaa, 'a', n_a);
    size_t unit = sizeof multi - 1, n_mix = unit * (1000000 / unit);
    char *mix = malloc(n_mix);
    ck_assert_ptr_nonnull(mix);
    for (size_t i = 0; i < n_mix; i += unit)
        memcpy(mix + i, multi, unit);
    for (int i = 0; i < N_HF; i++) {
        tokenizer_t *t = load_hf(i);
        int32_t *ids;
        size_t n;
        double t0 = clock_now_s();
        ck_assert_int_eq(tokenizer_encode(t, aaa, n_a, 0, &ids, &n), 0);
        double ta = clock_now_s() - t0;
        free(ids);
        t0 = clock_now_s();
        ck_assert_int_eq(tokenizer_encode(t, mix, n_mix, 0, &ids, &n), 0);
        double tm = clock_now_s() - t0;
        fprintf(stderr, "%s: 200k 'a' %.3f s; %.1f MB mixed text %.3f s (%zu tokens, %.1f MB/s)\n",
                hf_names[i], ta, n_mix / 1e6, tm, n, n_mix / 1e6 / tm);
        ck_assert_msg(ta < 5.0 && tm < 20.0, "%s: encoding is too slow", hf_names[i]);
        free(ids);
        tokenizer_destroy(&t);
    }
    tokenizer_t *t = load_ok(l2c[1].tok, 0);
    int32_t *ids;
    size_t n;
    double t0 = clock_now_s();
    ck_assert_int_eq(tokenizer_encode(t, aaa, n_a, 0, &ids, &n), 0);
    fprintf(stderr, "tok2048: 200k 'a' %.3f s\n", clock_now_s() - t0);
    free(ids);
    tokenizer_destroy(&t);
    free(aaa);
    free(mix);
}
END_TEST

/* Special-token parsing limited to spans: outside them a special token's text is plain
 * text (no special id comes from it), inside them it is the token; spans over the whole
 * text change nothing. Every bundled tokenizer: raw (Qwen3, Llama 3) and normalized
 * (TinyStories) special tokens, byte-level and SentencePiece vocabularies. */
START_TEST(test_hf_encode_spans)
{
    tokenizer_t *t = load_hf(_i);
    int32_t eos = tokenizer_eos_id(t);
    char *p;
    size_t pl;
    ck_assert_int_eq(tokenizer_decode(t, &eos, 1, 0, &p, &pl), 0);
    char text[256];
    /* Spaces before the tokens: TinyStories' normalized tokens are matched with the
     * metaspace the normalizer puts before them. */
    int n = snprintf(text, sizeof text, "%s hi %s there %s", p, p, p);
    size_t len = (size_t)n;
    int32_t *all, *ids;
    size_t n_all, n_ids;
    ck_assert_int_eq(tokenizer_encode(t, text, len, 0, &all, &n_all), 0);
    size_t specials = 0;
    for (size_t i = 0; i < n_all; i++)
        specials += all[i] == eos;
    ck_assert_uint_eq(specials, 3);
    /* No spans: no special id, and more ids than with the tokens. */
    ck_assert_int_eq(tokenizer_encode_spans(t, text, len, 0, NULL, 0, &ids, &n_ids), 0);
    for (size_t i = 0; i < n_ids; i++)
        ck_assert_msg(!tokenizer_is_special(t, ids[i]), "%s: id %d of %zu is special",
                      hf_names[_i], ids[i], i);
    ck_assert_uint_gt(n_ids, n_all);
    free(ids);
    /* The whole text: tokenizer_encode's ids, post-processor included. */
    text_span_t whole = {0, len};
    int32_t *bos_all;
    size_t n_bos_all;
    ck_assert_int_eq(tokenizer_encode(t, text, len, 1, &bos_all, &n_bos_all), 0);
    ck_assert_int_eq(tokenizer_encode_spans(t, text, len, 1, &whole, 1, &ids, &n_ids), 0);
    ck_assert_uint_eq(n_ids, n_bos_all);
    ck_assert(!memcmp(ids, bos_all, n_ids * sizeof *ids));
    free(ids);
    free(bos_all);
    /* The first and last tokens' bytes only (the last with its space): those two are
     * tokens, the middle one text. */
    text_span_t two[2] = {{0, pl}, {len - pl - 1, pl + 1}};
    ck_assert_int_eq(tokenizer_encode_spans(t, text, len, 0, two, 2, &ids, &n_ids), 0);
    specials = 0;
    for (size_t i = 0; i < n_ids; i++)
        specials += ids[i] == eos;
    ck_assert_uint_eq(specials, 2);
    ck_assert(n_ids != n_all || memcmp(ids, all, n_ids * sizeof *ids));
    free(ids);
    /* A span that ends inside the token does not hold it. */
    text_span_t part = {0, pl - 1};
    ck_assert_int_eq(tokenizer_encode_spans(t, text, len, 0, &part, 1, &ids, &n_ids), 0);
    for (size_t i = 0; i < n_ids; i++)
        ck_assert(ids[i] != eos);
    free(ids);
    /* Spans out of order or past the text. */
    text_span_t bad[2] = {{4, 2}, {1, 1}}, past = {len - 1, 2};
    ck_assert_int_eq(tokenizer_encode_spans(t, text, len, 0, bad, 2, &ids, &n_ids), RIVER_EINVAL);
    ck_assert_int_eq(tokenizer_encode_spans(t, text, len, 0, &past, 1, &ids, &n_ids),
                     RIVER_EINVAL);
    free(all);
    free(p);
    tokenizer_destroy(&t);
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("tokenizer");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_hf_cases, 0, N_HF);
    tcase_add_loop_test(tc, test_hf_special_ids, 0, N_HF);
    tcase_add_loop_test(tc, test_hf_encode_spans, 0, N_HF);
    tcase_add_test(tc, test_hf_skip_special);
    tcase_add_test(tc, test_hf_ignore_merges);
    tcase_add_test(tc, test_load_directory);
    tcase_add_loop_test(tc, test_l2c_golden, 0, 2);
    tcase_add_test(tc, test_hf_tinystories_golden);
    tcase_add_test(tc, test_l2c_byte_fallback);
    tcase_add_test(tc, test_l2c_ties);
    tcase_add_loop_test(tc, test_stream_multibyte, 0, N_HF);
    tcase_add_test(tc, test_stream_incomplete_tail);
    tcase_add_loop_test(tc, test_stream_random, 0, N_HF + 2);
    tcase_add_loop_test(tc, test_bad_ids, 0, N_HF + 2);
    tcase_add_test(tc, test_invalid_utf8);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_metaspace_and_added_flags);
    tcase_add_test(tc, test_speed);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(tokenizer_suite)
