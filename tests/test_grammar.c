/* The grammar engine (text/grammar.h): GBNF parsing and its errors; byte-level matching with
 * UTF-8 classes and tokens that end inside a character; token masks against a brute-force
 * reference (every token tried on a copy of the state) on random vocabularies and on the
 * Llama 3 vocabulary; JSON Schema compilation, its errors with JSON pointers, and random
 * walks whose text jansson parses and a small validator accepts; bounded whitespace; hostile
 * grammars and schemas; stop tokens; copy and rollback; tokenizer_token_bytes. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/err.h"
#include "tests/testutil.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"
#include "text/tokenizer.h"

#define LLAMA3 TEST_DATA "/tokenizers/llama3/tokenizer.json"

/* ---- vocabularies ----------------------------------------------------------------------- */

typedef struct tvocab {
    char **b;
    size_t *len;
    int n, cap;
} tvocab_t;

static void tv_add(tvocab_t *t, const char *s, size_t n)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 512;
        t->b = realloc(t->b, (size_t)t->cap * sizeof *t->b);
        t->len = realloc(t->len, (size_t)t->cap * sizeof *t->len);
        ck_assert(t->b && t->len);
    }
    t->b[t->n] = s ? malloc(n + 1) : NULL;
    if (s) {
        memcpy(t->b[t->n], s, n);
        t->b[t->n][n] = '\0';
    }
    t->len[t->n++] = s ? n : 0;
}

static void tv_adds(tvocab_t *t, const char *s)
{
    tv_add(t, s, strlen(s));
}

static void tv_free(tvocab_t *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->b[i]);
    free(t->b);
    free(t->len);
    memset(t, 0, sizeof *t);
}

/* The 256 single bytes, then the stop token (no bytes). */
static void tv_bytes(tvocab_t *t)
{
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        tv_add(t, &ch, 1);
    }
}

/* Builds the vocabulary with one stop token appended (its id is returned in *stop). */
static grammar_vocab_t *tv_build(tvocab_t *t, int32_t *stop)
{
    tv_add(t, NULL, 0);
    int32_t s = t->n - 1;
    grammar_vocab_t *v = NULL;
    ck_assert_msg(grammar_vocab_new(&v, (const char *const *)t->b, t->len, t->n, &s, 1) == 0,
                  "%s", river_err_detail());
    if (stop)
        *stop = s;
    return v;
}

/* The JSON-ish vocabulary of the random walks: every byte, pieces of JSON, partial UTF-8,
 * and seeded random strings over an alphabet of JSON's punctuation and some letters. */
static void tv_jsonish(tvocab_t *t, uint64_t seed)
{
    static const char *pieces[] = {
        "{\"", "\":", "\": ", "\", \"", "\"}", "},", "}]", "]}", "[\"", "\"]", "true", "false",
        "null", " \"", "\n  ", "\n    \"", " {", " [", "12", "-3", ".5", "e+", "E-", "00", "ab",
        "abc", "é", "\xC3", "\xA9", "\xE6\x97", "\xA5", "日本", "\\n", "\\u00", "\\\"", "é\"",
        ",\n", ", ", ": ", "\"\"", "[]", "{}", "  ", "\t", "\n", "0", "-", "a-", "b1", "zz",
        "\"a\"", "x\",", "ccc", "\U0001F600", "\xF0\x9F", "\x98\x80",
    };
    tv_bytes(t);
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
        tv_adds(t, pieces[i]);
    static const char alpha[] = "{}[]:,\" \nabcxyz019-.eE\\tru";
    test_rand_seed(seed);
    for (int i = 0; i < 120; i++) {
        char s[8];
        int n = 2 + (int)(test_rand_u32() % 5);
        for (int k = 0; k < n; k++)
            s[k] = alpha[test_rand_u32() % (sizeof alpha - 1)];
        tv_add(t, s, (size_t)n);
    }
}

/* ---- fixtures --------------------------------------------------------------------------- */

static grammar_t *gbnf(const char *text)
{
    grammar_t *g = NULL;
    ck_assert_msg(grammar_parse(&g, text, strlen(text)) == 0, "%s: %s", text,
                  river_err_detail());
    return g;
}

static grammar_t *schema(const char *text)
{
    grammar_t *g = NULL;
    ck_assert_msg(grammar_from_json_schema(&g, text, strlen(text)) == 0, "%s: %s", text,
                  river_err_detail());
    return g;
}

typedef struct fix {
    tvocab_t tv;
    grammar_t *g;
    grammar_vocab_t *v;
    grammar_matcher_t *m;
    grammar_state_t *s;
    int32_t stop;
    uint32_t *mask;
} fix_t;

/* Takes g; tv must be filled (the stop token is appended). */
static void fix_open(fix_t *f, grammar_t *g)
{
    f->g = g;
    f->v = tv_build(&f->tv, &f->stop);
    ck_assert_msg(grammar_matcher_new(&f->m, f->g, f->v) == 0, "%s", river_err_detail());
    ck_assert_msg(grammar_state_new(&f->s, f->m) == 0, "%s", river_err_detail());
    f->mask = calloc(((size_t)f->tv.n + 31) / 32, sizeof *f->mask);
}

static void fix_close(fix_t *f)
{
    grammar_state_destroy(&f->s);
    grammar_matcher_destroy(&f->m);
    grammar_vocab_destroy(&f->v);
    grammar_destroy(&f->g);
    tv_free(&f->tv);
    free(f->mask);
}

static int bit(const uint32_t *m, int t)
{
    return m[t / 32] >> (t % 32) & 1;
}

/* Byte-vocabulary fixture for acceptance tests. */
static void fix_bytes(fix_t *f, grammar_t *g)
{
    memset(f, 0, sizeof *f);
    tv_bytes(&f->tv);
    fix_open(f, g);
}

/* 1: text is a complete sentence; 0: a prefix of one; -1: refused (at some byte). */
static int run_text(fix_t *f, const char *text, size_t len)
{
    grammar_state_t *s = NULL;
    ck_assert_int_eq(grammar_state_new(&s, f->m), 0);
    int r = grammar_state_accept_bytes(s, text, len) ? -1 : grammar_state_can_end(s);
    grammar_state_destroy(&s);
    return r;
}

/* Compares the mask of f->s with trying every token on a copy; returns the mismatches. */
static int mask_vs_brute(fix_t *f, const char *where)
{
    ck_assert_msg(grammar_state_mask(f->s, f->mask) == 0, "%s", river_err_detail());
    grammar_state_t *c = NULL;
    ck_assert_int_eq(grammar_state_new(&c, f->m), 0);
    int bad = 0;
    for (int t = 0; t < f->tv.n; t++) {
        ck_assert_int_eq(grammar_state_copy(c, f->s), 0);
        int ok = grammar_state_accept(c, t) == 0;
        if (ok != bit(f->mask, t) && bad++ < 3)
            fprintf(stderr, "%s: token %d [%.*s] mask %d, accept %d\n", where, t,
                    (int)f->tv.len[t], f->tv.b[t] ? f->tv.b[t] : "", bit(f->mask, t), ok);
    }
    grammar_state_destroy(&c);
    return bad;
}

/* A random walk from a fresh state: `budget` random allowed tokens (seeded), then, while the
 * grammar cannot end, the allowed token that leaves the shortest completion. With `brute`
 * the mask is checked against the reference at every step. Appends the text to *out. */
static void walk(fix_t *f, int brute, int budget, uint64_t seed, grammar__buf_t *out)
{
    grammar_state_destroy(&f->s);
    ck_assert_int_eq(grammar_state_new(&f->s, f->m), 0);
    grammar_state_t *c = NULL;
    ck_assert_int_eq(grammar_state_new(&c, f->m), 0);
    int *cand = malloc((size_t)f->tv.n * sizeof *cand);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int step = 0;; step++) {
        ck_assert_msg(step < 4000, "walk %llu does not end", (unsigned long long)seed);
        char where[64];
        snprintf(where, sizeof where, "seed %llu step %d", (unsigned long long)seed, step);
        if (brute)
            ck_assert_msg(mask_vs_brute(f, where) == 0, "mask differs from the reference at %s",
                          where);
        else
            ck_assert_int_eq(grammar_state_mask(f->s, f->mask), 0);
        int n = 0;
        for (int t = 0; t < f->tv.n; t++)
            if (t != f->stop && bit(f->mask, t))
                cand[n++] = t;
        int can_end = grammar_state_can_end(f->s);
        ck_assert_int_eq(bit(f->mask, f->stop), can_end);
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        if (can_end && (n == 0 || step >= budget || rng % 8 == 0))
            break;
        ck_assert_msg(n > 0, "stuck at %s with nothing allowed", where);
        int pick = cand[rng % (uint64_t)n];
        if (step >= budget) {
            uint64_t best = UINT64_MAX;
            for (int k = 0; k < n; k++) {
                ck_assert_int_eq(grammar_state_copy(c, f->s), 0);
                ck_assert_int_eq(grammar_state_accept(c, cand[k]), 0);
                uint64_t rem = grammar__state_min_remaining(c);
                if (rem < best) {
                    best = rem;
                    pick = cand[k];
                }
            }
        }
        ck_assert_msg(grammar_state_accept(f->s, pick) == 0, "%s: %s", where,
                      river_err_detail());
        grammar__buf_put(out, f->tv.b[pick], f->tv.len[pick]);
    }
    ck_assert_int_eq(grammar_state_accept(f->s, f->stop), 0);
    ck_assert(grammar_state_is_done(f->s));
    grammar_state_destroy(&c);
    free(cand);
}

/* ---- GBNF ------------------------------------------------------------------------------- */

static void expect_parse_error(const char *text, int code, const char *needle)
{
    grammar_t *g = (grammar_t *)1;
    int err = grammar_parse(&g, text, strlen(text));
    ck_assert_msg(err == code, "%s: got %d (%s), want %d", text, err, river_err_detail(), code);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(river_err_detail(), needle), "%s: \"%s\" lacks \"%s\"", text,
                  river_err_detail(), needle);
}

START_TEST(test_gbnf_errors_name_line_column)
{
    expect_parse_error("root ::= \"a\"\nx ::= \"b", RIVER_EFORMAT,
                       "line 2, column 7: unterminated literal");
    expect_parse_error("root ::= \"\\q\"", RIVER_EFORMAT, "line 1, column 11: unknown escape");
    expect_parse_error("root ::= \"a\" foo", RIVER_EFORMAT,
                       "line 1, column 14: rule \"foo\" is used but not defined");
    expect_parse_error("root ::= (\"a\" | \"b\"\n", RIVER_EFORMAT,
                       "line 2, column 1: expected ')'");
    expect_parse_error("root ::= \"a\" )", RIVER_EFORMAT, "line 1, column 14: unmatched ')'");
    expect_parse_error("root ::= [a-", RIVER_EFORMAT, "unterminated character class");
    expect_parse_error("root ::= [z-a]", RIVER_EFORMAT, "range end");
    expect_parse_error("root ::= \"a\"{3,2}", RIVER_EFORMAT, "max < min");
    expect_parse_error("root ::= \"a\"\nroot ::= \"b\"", RIVER_EFORMAT,
                       "line 2, column 1: rule \"root\" defined twice");
    expect_parse_error("start ::= \"a\"", RIVER_EFORMAT, "no rule named \"root\"");
    expect_parse_error("root ::= \"x\" = \"y\"", RIVER_EFORMAT,
                       "line 1, column 14: unexpected '='");
    expect_parse_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", RIVER_EFORMAT,
                       "rule \"expr\" is left-recursive");
    expect_parse_error("root ::= \"a\" root", RIVER_EFORMAT, "rule \"root\" can never finish");
    expect_parse_error("root ::= (\"a\"*)* \"b\"", RIVER_EFORMAT,
                       "repeats something that can match nothing");
    expect_parse_error("root ::= [^\\x00-\\U0010FFFF]", RIVER_EFORMAT, "matches nothing");
    expect_parse_error("root ::= \"\\uD800\"", RIVER_EFORMAT, "is not a character");
    expect_parse_error("root ::= \"a\"{1,100000}", RIVER_ERANGE, "repetition count over 10000");
}
END_TEST

START_TEST(test_gbnf_literals_classes_repetition)
{
    fix_t f;
    fix_bytes(&f, gbnf("root ::= \"ab\" [0-9]{2,3} (\"x\" | \"yz\")* end\n"
                       "end ::= \"!\"?  # optional bang\n"));
    static const struct {
        const char *text;
        int want;
    } cases[] = {
        {"ab12", 1},   {"ab123", 1},   {"ab12x", 1},   {"ab123xyzx!", 1}, {"ab12!", 1},
        {"ab", 0},     {"ab1", 0},     {"ab12y", 0},   {"", 0},           {"ab1234", -1},
        {"abc", -1},   {"ab12!x", -1}, {"ab12yy", -1}, {"b", -1},         {"ab12!!", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        ck_assert_msg(run_text(&f, cases[i].text, strlen(cases[i].text)) == cases[i].want,
                      "\"%s\": want %d", cases[i].text, cases[i].want);
    /* Byte by byte: a refused byte fails and leaves the state where it was. */
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "ab1", 3), 0);
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "q", 1), RIVER_EINVAL);
    ck_assert_int_eq(grammar_state_can_end(f.s), 0);
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "2", 1), 0);
    ck_assert_int_eq(grammar_state_can_end(f.s), 1);
    ck_assert_int_eq(grammar_state_is_done(f.s), 0);
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "yz!", 3), 0);
    ck_assert_int_eq(grammar_state_is_done(f.s), 1);
    fix_close(&f);
}
END_TEST

START_TEST(test_gbnf_escapes_comments_continuation)
{
    fix_t f;
    fix_bytes(&f, gbnf("# a grammar\n"
                       "root ::= \"\\x41\\t\\u00e9\\U0001F600\\n\" rest   # comment\n"
                       "rest ::= \"[\" | \"\\\"\"\n"
                       "  | (\n"
                       "      \"\\\\\" .\n"
                       "    )\n"
                       "  | [\\]\\-^]\n"));
    ck_assert_int_eq(run_text(&f, "A\t\xC3\xA9\xF0\x9F\x98\x80\n[", 10), 1);
    ck_assert_int_eq(run_text(&f, "A\t\xC3\xA9\xF0\x9F\x98\x80\n\"", 10), 1);
    ck_assert_int_eq(run_text(&f, "A\t\xC3\xA9\xF0\x9F\x98\x80\n\\\xE6\x97\xA5", 13), 1);
    ck_assert_int_eq(run_text(&f, "A\t\xC3\xA9\xF0\x9F\x98\x80\n]", 10), 1);
    ck_assert_int_eq(run_text(&f, "A\t\xC3\xA9\xF0\x9F\x98\x80\n-", 10), 1);
    ck_assert_int_eq(run_text(&f, "A\t\xC3\xA9\xF0\x9F\x98\x80\n^", 10), 1);
    ck_assert_int_eq(run_text(&f, "A\t\xC3\xA9\xF0\x9F\x98\x80\nx", 10), -1);
    ck_assert_int_eq(run_text(&f, "A\te", 3), -1);
    fix_close(&f);
}
END_TEST

START_TEST(test_utf8_classes)
{
    fix_t f;
    fix_bytes(&f, gbnf("root ::= ( [^\"\\\\] | [α-ω] )+"));
    ck_assert_int_eq(run_text(&f, "a\xC3\xA9\xE6\x97\xA5\xF0\x9F\x98\x80", 10), 1);
    /* A multi-byte character is not complete until its last byte. */
    ck_assert_int_eq(run_text(&f, "\xE6\x97", 2), 0);
    ck_assert_int_eq(run_text(&f, "\xE6", 1), 0);
    /* Invalid UTF-8 never matches: overlong, surrogate, stray continuation, 0xFF, too big. */
    ck_assert_int_eq(run_text(&f, "\xC0\x80", 2), -1);
    ck_assert_int_eq(run_text(&f, "\xE0\x80\x80", 3), -1);
    ck_assert_int_eq(run_text(&f, "\xED\xA0\x80", 3), -1);
    ck_assert_int_eq(run_text(&f, "\x80", 1), -1);
    ck_assert_int_eq(run_text(&f, "\xFF", 1), -1);
    ck_assert_int_eq(run_text(&f, "\xF4\x90\x80\x80", 4), -1);
    ck_assert_int_eq(run_text(&f, "\"", 1), -1);
    ck_assert_int_eq(run_text(&f, "a\\", 2), -1);
    fix_close(&f);
    /* A narrow class refuses at the byte that leaves it: ε is U+03B5 (CE B5). */
    fix_bytes(&f, gbnf("root ::= [α-ε] [a]"));
    ck_assert_int_eq(run_text(&f, "\xCE\xB5" "a", 3), 1);
    ck_assert_int_eq(run_text(&f, "\xCE", 1), 0);
    ck_assert_int_eq(run_text(&f, "\xCE\xB6", 2), -1);
    ck_assert_int_eq(run_text(&f, "\xCF", 1), -1);
    ck_assert_int_eq(run_text(&f, "a", 1), -1);
    fix_close(&f);
    /* "." is any character, newline included. */
    fix_bytes(&f, gbnf("root ::= . ."));
    ck_assert_int_eq(run_text(&f, "\n\xF0\x9F\x98\x80", 5), 1);
    fix_close(&f);
}
END_TEST

START_TEST(test_partial_utf8_tokens)
{
    fix_t f = {0};
    const char *toks[] = {"\"", "\xC3", "\xA9", "\xC3\xA9", "\xE6\x97", "\xA5", "\xA9\"", "a",
                          "\xE6"};
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++)
        tv_adds(&f.tv, toks[i]);
    fix_open(&f, gbnf("root ::= \"\\\"\" [^\"]* \"\\\"\""));
    ck_assert_int_eq(mask_vs_brute(&f, "start"), 0);
    ck_assert_int_eq(grammar_state_accept(f.s, 0), 0);
    ck_assert_int_eq(mask_vs_brute(&f, "after quote"), 0);
    /* Lead bytes may end a token; continuation bytes alone may not start a character. */
    ck_assert(bit(f.mask, 1) && bit(f.mask, 4) && bit(f.mask, 8) && bit(f.mask, 3));
    ck_assert(!bit(f.mask, 2) && !bit(f.mask, 5) && !bit(f.mask, 6));
    ck_assert_int_eq(grammar_state_accept(f.s, 1), 0); /* C3 */
    ck_assert_int_eq(mask_vs_brute(&f, "after C3"), 0);
    ck_assert(bit(f.mask, 2) && bit(f.mask, 6) && bit(f.mask, 5)); /* C3 A5 is "å" */
    ck_assert(!bit(f.mask, 0) && !bit(f.mask, 1) && !bit(f.mask, 3) && !bit(f.mask, 7));
    ck_assert(!bit(f.mask, f.stop));
    ck_assert_int_eq(grammar_state_accept(f.s, 6), 0); /* A9 then the closing quote */
    ck_assert(grammar_state_can_end(f.s));
    ck_assert(grammar_state_is_done(f.s));
    fix_close(&f);
    /* A class of one two-byte range: after the lead byte, only its continuation bytes. */
    memset(&f, 0, sizeof f);
    tv_bytes(&f.tv);
    fix_open(&f, gbnf("root ::= [é-ê]"));
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "\xC3", 1), 0);
    ck_assert_int_eq(grammar_state_mask(f.s, f.mask), 0);
    for (int b = 0; b < 256; b++)
        ck_assert_int_eq(bit(f.mask, b), b >= 0xA9 && b <= 0xAA);
    fix_close(&f);
}
END_TEST

START_TEST(test_tokens_spanning_elements)
{
    fix_t f = {0};
    const char *toks[] = {"{\"", "\":", "\": ", "\", \"", "\"}", "ab", "a", "b", "1", "12",
                          ", \"b\":", "}", "{", "\"", ":", "a\": 1}"};
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++)
        tv_adds(&f.tv, toks[i]);
    fix_open(&f, gbnf("root ::= \"{\" \"\\\"a\\\"\" \":\" \" \"? num "
                      "(\", \" \"\\\"b\\\"\" \":\" num)? \"}\"\n"
                      "num ::= [0-9]+"));
    ck_assert_int_eq(mask_vs_brute(&f, "start"), 0);
    ck_assert(bit(f.mask, 0) && bit(f.mask, 12) && !bit(f.mask, 13));
    ck_assert_int_eq(grammar_state_accept(f.s, 0), 0); /* {" */
    ck_assert_int_eq(mask_vs_brute(&f, "key"), 0);
    ck_assert(bit(f.mask, 6) && bit(f.mask, 15) && !bit(f.mask, 5));
    ck_assert_int_eq(grammar_state_accept(f.s, 15), 0); /* a": 1} spans five elements */
    ck_assert(grammar_state_is_done(f.s));
    fix_close(&f);
}
END_TEST

/* ---- masks against the reference -------------------------------------------------------- */

static const char *const walk_grammars[] = {
    "root ::= \"{\" ws ( pair ( \",\" ws pair )* )? \"}\"\n"
    "pair ::= str \":\" ws val ws\n"
    "val ::= str | [0-9]{1,3} | \"true\" | root\n"
    "str ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [\"n] )* \"\\\"\"\n"
    "ws ::= [ \\n]{0,2}\n",
    "root ::= ( [a-c]+ \"-\" | \"日本\" | [é-ê]{2} )* \"!\"",
    "root ::= item{2,40}\nitem ::= \"ab\" | \"a\" | \"b\" [0-9]? | \"\\\"\" [^\"]{0,3} \"\\\"\"",
};

START_TEST(test_mask_matches_reference_random_vocab)
{
    for (size_t gi = 0; gi < sizeof walk_grammars / sizeof *walk_grammars; gi++)
        for (uint64_t seed = 1; seed <= 4; seed++) {
            fix_t f = {0};
            tv_jsonish(&f.tv, seed);
            fix_open(&f, gbnf(walk_grammars[gi]));
            grammar__buf_t out = {0};
            walk(&f, 1, 25, seed, &out);
            grammar__buf_free(&out);
            fix_close(&f);
        }
    /* And a compiled schema, with the JSON pieces. */
    for (uint64_t seed = 1; seed <= 4; seed++) {
        fix_t f = {0};
        tv_jsonish(&f.tv, seed + 10);
        fix_open(&f, schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                            "\"maxLength\":6},\"b\":{\"type\":\"array\",\"items\":{\"type\":"
                            "\"number\"}},\"c\":{\"enum\":[\"x\",null,true]}},"
                            "\"required\":[\"a\"]}"));
        grammar__buf_t out = {0};
        walk(&f, 1, 30, seed, &out);
        grammar__buf_free(&out);
        fix_close(&f);
    }
}
END_TEST

/* The Llama 3 vocabulary as byte strings (special tokens: none), or NULL when absent. */
static tokenizer_t *llama3_tokens(tvocab_t *tv)
{
    tokenizer_t *tok = NULL;
    if (tokenizer_load(&tok, LLAMA3, 0) != 0) {
        TEST_SKIP(TEST_SKIP_MISSING, "grammar: %s not loadable: %s", LLAMA3, river_err_detail());
        return NULL;
    }
    int n = tokenizer_vocab_size(tok);
    char buf[4096];
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        if (tokenizer_is_special(tok, i) || tokenizer_token_bytes(tok, i, buf, sizeof buf, &len))
            tv_add(tv, NULL, 0);
        else
            tv_add(tv, buf, len);
    }
    return tok;
}

START_TEST(test_mask_matches_reference_llama3_slice)
{
    tvocab_t all = {0};
    tokenizer_t *tok = llama3_tokens(&all);
    if (!tok)
        return;
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
        "\"n\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a b\","
        "\"c\"]},\"maxItems\":3}},\"required\":[\"name\",\"n\"]}",
        "{\"type\":\"object\",\"additionalProperties\":true}",
    };
    for (size_t si = 0; si < 2; si++)
        for (uint64_t seed = 1; seed <= 3; seed++) {
            fix_t f = {0};
            /* A slice: the first 2500 ids, and every token with JSON punctuation in it. */
            for (int i = 0; i < all.n; i++) {
                int keep = i < 2500 && all.len[i];
                for (size_t k = 0; !keep && k < all.len[i]; k++)
                    keep = strchr("{}[]\":,\\", all.b[i][k]) && all.b[i][k];
                if (keep)
                    tv_add(&f.tv, all.b[i], all.len[i]);
            }
            fix_open(&f, schema(schemas[si]));
            grammar__buf_t out = {0};
            walk(&f, 1, 30, seed, &out);
            json_error_t je;
            json_t *j = json_loadb(out.p, out.len, 0, &je);
            ck_assert_msg(j, "not JSON: %.*s (%s)", (int)out.len, out.p, je.text);
            json_decref(j);
            grammar__buf_free(&out);
            fix_close(&f);
        }
    tv_free(&all);
    tokenizer_destroy(&tok);
}
END_TEST

START_TEST(test_mask_matches_reference_llama3_document)
{
    /* The whole vocabulary, following a pretty-printed document's own tokenization, with the
     * reference at every step. */
    fix_t f = {0};
    tokenizer_t *tok = llama3_tokens(&f.tv);
    if (!tok)
        return;
    fix_open(&f, schema("{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\","
                        "\"maxLength\":60},\"score\":{\"type\":\"number\"},\"ok\":{\"type\":"
                        "\"boolean\"},\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\""
                        ",\"pattern\":\"^[a-z]+-[0-9]{2}$\"}}},\"required\":[\"title\",\"score\","
                        "\"ok\",\"items\"]}"));
    const char *doc = "{\n  \"title\": \"Café \\\"déjà vu\\\" 日本\",\n  \"score\": -1.5e3,\n"
                      "  \"ok\": false,\n  \"items\": [\"ab-12\", \"zz-99\"]\n}";
    int32_t *ids = NULL;
    size_t n = 0;
    ck_assert_int_eq(tokenizer_encode(tok, doc, strlen(doc), 0, &ids, &n), 0);
    for (size_t i = 0; i < n; i++) {
        char where[32];
        snprintf(where, sizeof where, "token %zu", i);
        ck_assert_msg(mask_vs_brute(&f, where) == 0, "mask differs at %s", where);
        ck_assert_msg(bit(f.mask, ids[i]), "document token %zu (%d) refused", i, (int)ids[i]);
        ck_assert_int_eq(grammar_state_accept(f.s, ids[i]), 0);
    }
    ck_assert(grammar_state_can_end(f.s));
    free(ids);
    tokenizer_destroy(&tok);
    fix_close(&f);
}
END_TEST

START_TEST(test_llama3_token_bytes)
{
    tokenizer_t *tok = NULL;
    if (tokenizer_load(&tok, LLAMA3, 0) != 0) {
        TEST_SKIP(TEST_SKIP_MISSING, "grammar: %s not loadable", LLAMA3);
        return;
    }
    /* "é" is two byte-level tokens' worth in some merges: find a token that is the lone byte
     * C3 and check the raw path gives that byte where decoding gives U+FFFD. */
    int found = 0;
    char buf[64];
    for (int id = 0; id < tokenizer_vocab_size(tok) && !found; id++) {
        size_t len = 0;
        if (tokenizer_token_bytes(tok, id, buf, sizeof buf, &len) || len != 1 ||
            (unsigned char)buf[0] != 0xC3)
            continue;
        char *text = NULL;
        size_t tl = 0;
        ck_assert_int_eq(tokenizer_decode(tok, &id, 1, 0, &text, &tl), 0);
        ck_assert_msg(tl == 3 && memcmp(text, "\xEF\xBF\xBD", 3) == 0, "decode of C3: %s", text);
        free(text);
        found = 1;
    }
    ck_assert_msg(found, "no token of the lone byte C3");
    int32_t *ids = NULL;
    size_t n = 0;
    ck_assert_int_eq(tokenizer_encode(tok, " hello", 6, 0, &ids, &n), 0);
    ck_assert_uint_eq(n, 1);
    size_t len = 0;
    ck_assert_int_eq(tokenizer_token_bytes(tok, ids[0], buf, sizeof buf, &len), 0);
    ck_assert_uint_eq(len, 6);
    ck_assert_int_eq(memcmp(buf, " hello", 6), 0);
    ck_assert_int_eq(tokenizer_token_bytes(tok, ids[0], buf, 3, &len), RIVER_ERANGE);
    free(ids);
    tokenizer_destroy(&tok);
}
END_TEST

/* ---- JSON Schema ------------------------------------------------------------------------ */

static void expect_schema_error(const char *text, int code, const char *needle)
{
    grammar_t *g = (grammar_t *)1;
    int err = grammar_from_json_schema(&g, text, strlen(text));
    ck_assert_msg(err == code, "%s: got %d (%s), want %d", text, err, river_err_detail(), code);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(river_err_detail(), needle), "%s: \"%s\" lacks \"%s\"", text,
                  river_err_detail(), needle);
}

START_TEST(test_schema_errors_name_paths)
{
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integr\"}}}",
                        RIVER_EFORMAT, "/properties/age/type: unknown type \"integr\"");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"a/b\":{\"type\":\"string\","
                        "\"fancy\":1}}}",
                        RIVER_EUNSUPPORTED, "/properties/a~1b/fancy: unsupported keyword");
    expect_schema_error("{\"properties\":{\"a\":{}},\"required\":[\"a\",\"b\"]}", RIVER_EFORMAT,
                        "/required/1: \"b\" is not in properties");
    expect_schema_error("{\"properties\":{\"a\":{\"$ref\":\"#/$defs/nope\"}}}", RIVER_EFORMAT,
                        "/properties/a/$ref: \"#/$defs/nope\" does not resolve");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", RIVER_EUNSUPPORTED,
                        "/pattern: pattern at offset");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"a\\\\bc\"}", RIVER_EUNSUPPORTED,
                        "word boundaries");
    expect_schema_error("{\"type\":\"string\",\"maxLength\":20000}", RIVER_ERANGE,
                        "/maxLength: 20000 is over the limit");
    expect_schema_error("{\"type\":\"array\",\"minItems\":-1}", RIVER_EFORMAT,
                        "/minItems: must be a non-negative integer");
    expect_schema_error("{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", RIVER_EFORMAT,
                        "/maxLength: 2 is less than minLength 5");
    expect_schema_error("{\"type\":\"object\"", RIVER_EFORMAT, "not valid JSON");
    expect_schema_error("{\"allOf\":[{},{}]}", RIVER_EUNSUPPORTED, "/allOf: only one schema");
    expect_schema_error("{\"anyOf\":[{}],\"type\":\"string\"}", RIVER_EUNSUPPORTED,
                        "/type: combining anyOf with other keywords");
    expect_schema_error("{\"properties\":{\"x\":false}}", RIVER_EFORMAT,
                        "/properties/x: the schema false matches nothing");
    expect_schema_error("{\"type\":[\"string\",3]}", RIVER_EFORMAT,
                        "/type: must be a string or a list of strings");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}",
                        RIVER_EUNSUPPORTED, "pattern together with minLength/maxLength");
}
END_TEST

/* A validator of the schema subset, for the walks' output. *why gets the failure. */
static int validate(json_t *v, json_t *s, json_t *root, const char **why);

static json_t *resolve_ref(json_t *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        return json_object_get(json_object_get(root, "$defs"), ref + 8);
    if (strncmp(ref, "#/definitions/", 14) == 0)
        return json_object_get(json_object_get(root, "definitions"), ref + 14);
    return NULL;
}

static size_t utf8_chars(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

static int type_ok(json_t *v, const char *t)
{
    return (!strcmp(t, "null") && json_is_null(v)) ||
           (!strcmp(t, "boolean") && json_is_boolean(v)) ||
           (!strcmp(t, "object") && json_is_object(v)) ||
           (!strcmp(t, "array") && json_is_array(v)) ||
           (!strcmp(t, "string") && json_is_string(v)) ||
           (!strcmp(t, "number") && json_is_number(v)) ||
           (!strcmp(t, "integer") && json_is_integer(v));
}

static int validate(json_t *v, json_t *s, json_t *root, const char **why)
{
    if (json_is_true(s))
        return 1;
    json_t *x;
    if ((x = json_object_get(s, "$ref")))
        return validate(v, resolve_ref(root, json_string_value(x)), root, why);
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (validate(v, json_array_get(x, i), root, why))
                return 1;
        *why = "no alternative matches";
        return 0;
    }
    if ((x = json_object_get(s, "enum"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (json_equal(v, json_array_get(x, i)))
                return 1;
        *why = "not in enum";
        return 0;
    }
    if ((x = json_object_get(s, "const"))) {
        *why = "not the const";
        return json_equal(v, x);
    }
    if ((x = json_object_get(s, "type"))) {
        int ok = 0;
        if (json_is_string(x))
            ok = type_ok(v, json_string_value(x));
        for (size_t i = 0; json_is_array(x) && i < json_array_size(x); i++)
            ok |= type_ok(v, json_string_value(json_array_get(x, i)));
        if (!ok) {
            *why = "wrong type";
            return 0;
        }
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties");
        json_t *addl = json_object_get(s, "additionalProperties");
        const char *k;
        json_t *val;
        json_object_foreach(v, k, val)
        {
            json_t *ps = props ? json_object_get(props, k) : NULL;
            int extra_ok = addl && !json_is_false(addl);
            if (!ps && !extra_ok) {
                *why = "extra key";
                return 0;
            }
            /* Extra members may repeat a declared key (text/grammar.h says so). */
            if (!(ps && validate(val, ps, root, why)) &&
                !(extra_ok && validate(val, addl, root, why)))
                return 0;
        }
        json_t *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) {
                *why = "missing required key";
                return 0;
            }
    }
    if (json_is_array(v)) {
        json_t *items = json_object_get(s, "items");
        for (size_t i = 0; items && i < json_array_size(v); i++)
            if (!validate(json_array_get(v, i), items, root, why))
                return 0;
        json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if ((mn && json_array_size(v) < (size_t)json_integer_value(mn)) ||
            (mx && json_array_size(v) > (size_t)json_integer_value(mx))) {
            *why = "item count";
            return 0;
        }
    }
    if (json_is_string(v)) {
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
        if ((mn && n < (size_t)json_integer_value(mn)) ||
            (mx && n > (size_t)json_integer_value(mx))) {
            *why = "string length";
            return 0;
        }
        if ((x = json_object_get(s, "pattern"))) {
            int ec;
            PCRE2_SIZE eo;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)json_string_value(x), PCRE2_ZERO_TERMINATED,
                                           PCRE2_UTF, &ec, &eo, NULL);
            ck_assert(re);
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
            int rc = pcre2_match(re, (PCRE2_SPTR)json_string_value(v), json_string_length(v), 0, 0,
                                 md, NULL);
            pcre2_match_data_free(md);
            pcre2_code_free(re);
            if (rc < 0) {
                *why = "pattern";
                return 0;
            }
        }
    }
    if (json_is_number(v) && (x = json_object_get(s, "minimum")) && json_number_value(x) == 0 &&
        json_number_value(v) < 0) {
        *why = "negative";
        return 0;
    }
    return 1;
}

static const char *const walk_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":0},"
    "\"name\":{\"type\":\"string\"},\"opt\":{\"type\":\"boolean\"},\"inner\":{\"type\":\"object\","
    "\"properties\":{\"x\":{\"type\":\"null\"},\"y\":{\"type\":\"number\"}},\"required\":[\"y\"],"
    "\"additionalProperties\":false}},\"required\":[\"id\",\"inner\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}",
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}",
    "{\"type\":\"string\",\"pattern\":\"^[a-c]{2}-\\\\d+(x|yz)?$\"}",
    "{\"type\":\"string\",\"pattern\":\"a\\\\.b\"}",
    "{\"type\":\"string\",\"pattern\":\"^[^a-z\\\"]{1,3}\\\\s\\\\w$\"}",
    "{\"enum\":[\"x\",1,null,{\"a\":[1,2]},\"é\\\"q\",2.5]}",
    "{\"const\":{\"k\":true,\"l\":[]}}",
    "{\"type\":\"number\"}",
    "{\"type\":\"boolean\"}",
    "{\"type\":\"null\"}",
    "{\"type\":[\"string\",\"null\"]}",
    "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}",
    "{\"oneOf\":[{\"const\":\"a\"},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}]}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"definitions\":{\"s\":{\"type\":\"string\",\"maxLength\":2}},\"type\":\"object\","
    "\"properties\":{\"a\":{\"$ref\":\"#/definitions/s\"}},\"additionalProperties\":{\"type\":"
    "\"integer\"}}",
    "{\"type\":\"object\",\"additionalProperties\":true}",
    "{}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":40},\"maxItems\":3}",
};

START_TEST(test_schema_random_walks_validate)
{
    for (size_t si = 0; si < sizeof walk_schemas / sizeof *walk_schemas; si++) {
        json_t *sch = json_loads(walk_schemas[si], 0, NULL);
        ck_assert(sch);
        fix_t f = {0};
        tv_jsonish(&f.tv, 100 + si);
        fix_open(&f, schema(walk_schemas[si]));
        int addl = json_object_get(sch, "additionalProperties") != NULL;
        for (uint64_t seed = 1; seed <= 12; seed++) {
            grammar__buf_t out = {0};
            walk(&f, seed <= 2, 12 + (int)(seed * 5), seed * 7919 + si, &out);
            json_error_t je;
            json_t *v = json_loadb(out.p ? out.p : "", out.len,
                                   JSON_DECODE_ANY | JSON_ALLOW_NUL |
                                       (addl ? 0 : JSON_REJECT_DUPLICATES),
                                   &je);
            ck_assert_msg(v, "schema %zu seed %llu: not JSON: [%.*s] (%s)", si,
                          (unsigned long long)seed, (int)out.len, out.p, je.text);
            const char *why = "";
            ck_assert_msg(validate(v, sch, sch, &why), "schema %zu seed %llu: [%.*s]: %s", si,
                          (unsigned long long)seed, (int)out.len, out.p, why);
            json_decref(v);
            grammar__buf_free(&out);
        }
        fix_close(&f);
        json_decref(sch);
    }
}
END_TEST

START_TEST(test_schema_texts)
{
    /* Fixed texts in and out, over the byte vocabulary. */
    static const struct {
        const char *schema, *text;
        int want;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"b\"]}",
         "{\"a\": 1, \"b\": \"x\"}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"b\"]}",
         "{\"b\":\"x\"}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"b\"]}",
         "{\"a\":1", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\"}},\"required\":[\"b\"]}",
         "{\"b\":\"x\",\"a\":1}", -1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"c\":1}", -1},
        {"{\"type\":\"object\"}", "{}", 1},
        {"{\"type\":\"object\"}", "{\"a\"", -1},
        {"{\"type\":\"integer\",\"minimum\":0}", "-1", -1},
        {"{\"type\":\"integer\"}", "-0", 1},
        {"{\"type\":\"integer\"}", "1.5", -1},
        {"{\"type\":\"integer\"}", "01", -1},
        {"{\"type\":\"integer\"}", "1234567890123456", 1},
        {"{\"type\":\"integer\"}", "12345678901234567", -1},
        {"{\"type\":\"number\"}", "-0.5e-12", 1},
        {"{\"type\":\"number\"}", "1e123", -1},
        {"{\"type\":\"string\",\"maxLength\":2}", "\"\\u00e9\\n\"", 1},
        {"{\"type\":\"string\",\"maxLength\":2}", "\"abc\"", -1},
        {"{\"type\":\"string\"}", "\"a\nb\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", "\"aaa\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", "\"aab\"", -1},
        {"{\"type\":\"string\",\"pattern\":\"b\"}", "\"xbx\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\\\\"$\"}", "\"\\\"\"", 1},
        {"{\"enum\":[\"a\",[1,{\"b\":null}]]}", "[1,{\"b\":null}]", 1},
        {"{\"enum\":[\"a\",[1,{\"b\":null}]]}", "[1, {\"b\":null}]", -1},
        {"{\"type\":\"array\",\"maxItems\":1}", "[1, 2]", -1},
        {"{\"type\":\"array\",\"minItems\":1}", "[]", -1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"null\"}}", "[\n  null,\n\tnull\n]", 1},
        /* Whitespace: one space, or a newline and up to 16 spaces or tabs; nothing outside. */
        {"{\"type\":\"array\"}", "[  1]", -1},
        {"{\"type\":\"array\"}", "[\n                1]", 1},
        {"{\"type\":\"array\"}", "[\n                 1]", -1},
        {"{\"type\":\"array\"}", " [1]", -1},
        {"{\"type\":\"array\"}", "[1] ", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fix_t f;
        fix_bytes(&f, schema(cases[i].schema));
        int got = run_text(&f, cases[i].text, strlen(cases[i].text));
        ck_assert_msg(got == cases[i].want, "%s on %s: got %d want %d", cases[i].schema,
                      cases[i].text, got, cases[i].want);
        fix_close(&f);
    }
}
END_TEST

START_TEST(test_schema_to_gbnf_composes)
{
    char *rules = NULL;
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get\"},"
                    "\"arguments\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":"
                    "\"string\"}},\"required\":[\"q\"]}},\"required\":[\"name\",\"arguments\"]}";
    ck_assert_int_eq(grammar_json_schema_to_gbnf(s, strlen(s), "call", &rules), 0);
    ck_assert_ptr_nonnull(strstr(rules, "call ::= "));
    grammar__buf_t text = {0};
    grammar__buf_puts(&text, "root ::= \"<tool_call>\" call \"</tool_call>\"\n");
    grammar__buf_puts(&text, rules);
    free(rules);
    fix_t f;
    fix_bytes(&f, gbnf(text.p));
    grammar__buf_free(&text);
    const char *ok = "<tool_call>{\"name\": \"get\", \"arguments\": {\"q\": \"x\"}}</tool_call>";
    ck_assert_int_eq(run_text(&f, ok, strlen(ok)), 1);
    const char *bad = "<tool_call>{\"name\": \"put\"";
    ck_assert_int_eq(run_text(&f, bad, strlen(bad)), -1);
    fix_close(&f);
    ck_assert_int_eq(grammar_json_schema_to_gbnf(s, strlen(s), "bad prefix", &rules),
                     RIVER_EINVAL);
    ck_assert_ptr_null(rules);
}
END_TEST

/* ---- bounds ----------------------------------------------------------------------------- */

START_TEST(test_whitespace_is_bounded)
{
    fix_t f = {0};
    const char *ws[] = {" ", "\n", "\t", "  ", "\n  ", "\n\t\t", "    ", "\n\n", "\r"};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
        tv_adds(&f.tv, ws[i]);
    tv_adds(&f.tv, "{");
    tv_adds(&f.tv, "}");
    grammar_t *g = NULL;
    ck_assert_int_eq(grammar_json_object(&g), 0);
    fix_open(&f, g);
    ck_assert_int_eq(grammar_state_mask(f.s, f.mask), 0);
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
        ck_assert_msg(!bit(f.mask, (int)i), "whitespace before the document");
    ck_assert_int_eq(grammar_state_accept(f.s, 9), 0); /* { */
    /* Whitespace only, greedily the longest: it must run out. */
    int steps = 0;
    for (;; steps++) {
        ck_assert_int_lt(steps, 40);
        ck_assert_int_eq(grammar_state_mask(f.s, f.mask), 0);
        int pick = -1;
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
            if (bit(f.mask, (int)i) && (pick < 0 || f.tv.len[i] >= f.tv.len[pick]))
                pick = (int)i;
        if (pick < 0)
            break;
        ck_assert_int_eq(grammar_state_accept(f.s, pick), 0);
    }
    ck_assert_int_gt(steps, 0);
    ck_assert(bit(f.mask, 10)); /* } still is */
    fix_close(&f);
}
END_TEST

START_TEST(test_hostile_inputs_fail_cleanly)
{
    /* 10000 nested parentheses. */
    size_t n = 10000;
    char *deep = malloc(2 * n + 32);
    strcpy(deep, "root ::= ");
    size_t at = strlen(deep);
    for (size_t i = 0; i < n; i++)
        deep[at++] = '(';
    deep[at++] = '"';
    deep[at++] = 'a';
    deep[at++] = '"';
    for (size_t i = 0; i < n; i++)
        deep[at++] = ')';
    deep[at] = '\0';
    expect_parse_error(deep, RIVER_ERANGE, "parentheses nested deeper than 64");
    /* A schema 10000 objects deep. */
    grammar__buf_t js = {0};
    for (size_t i = 0; i < n; i++)
        grammar__buf_puts(&js, "{\"type\":\"object\",\"properties\":{\"a\":");
    grammar__buf_puts(&js, "{}");
    for (size_t i = 0; i < n; i++)
        grammar__buf_puts(&js, "}}");
    grammar_t *g = (grammar_t *)1;
    ck_assert_int_ne(grammar_from_json_schema(&g, js.p, js.len), 0);
    ck_assert_ptr_null(g);
    grammar__buf_free(&js);
    /* 200 deep: valid JSON, over the nesting limit. */
    for (size_t i = 0; i < 200; i++)
        grammar__buf_puts(&js, "{\"type\":\"object\",\"properties\":{\"a\":");
    grammar__buf_puts(&js, "{}");
    for (size_t i = 0; i < 200; i++)
        grammar__buf_puts(&js, "}}");
    expect_schema_error(js.p, RIVER_ERANGE, "schema nested deeper than 64 levels");
    grammar__buf_free(&js);
    /* A huge enum. */
    grammar__buf_puts(&js, "{\"enum\":[");
    for (int i = 0; i < 5000; i++)
        grammar__buf_printf(&js, "%s\"v%d\"", i ? "," : "", i);
    grammar__buf_puts(&js, "]}");
    expect_schema_error(js.p, RIVER_ERANGE, "/enum: 5000 values, over the limit of 4096");
    grammar__buf_free(&js);
    /* $ref recursion with no way out, and one that recurses before matching anything. */
    expect_schema_error("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":"
                        "\"#/$defs/n\"}},\"required\":[\"k\"]}},\"$ref\":\"#/$defs/n\"}",
                        RIVER_EFORMAT, "recursive $ref with no way out");
    expect_schema_error("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", RIVER_EFORMAT,
                        "recursive $ref that recurses before matching anything");
    expect_schema_error("{\"$ref\":\"http://example.com/s.json\"}", RIVER_EFORMAT,
                        "does not resolve");
    /* Repetition bounds and sizes. */
    expect_parse_error("root ::= [a-z]{0,10001}", RIVER_ERANGE, "repetition count over");
    grammar__buf_t big = {0};
    grammar__buf_puts(&big, "root ::= (\"");
    for (int i = 0; i < 128; i++)
        grammar__buf_puts(&big, "a");
    grammar__buf_puts(&big, "\"){10000}");
    expect_parse_error(big.p, RIVER_ERANGE, "more than 1048576 elements");
    grammar__buf_free(&big);
    free(deep);
    /* An exponentially ambiguous grammar still compiles and matches in bounded stacks. */
    fix_t f;
    fix_bytes(&f, gbnf("root ::= (\"a\" | \"a\" | \"aa\")* (\"a\" \"a\"*)* \"b\""));
    char text[302];
    memset(text, 'a', 300);
    text[300] = 'b';
    ck_assert_int_eq(run_text(&f, text, 301), 1);
    ck_assert_int_eq(grammar_state_mask(f.s, f.mask), 0);
    fix_close(&f);
}
END_TEST

START_TEST(test_depth_limit_is_exact)
{
    /* Near GRAMMAR_MAX_DEPTH the mask must still equal the reference: a bracket token that
     * would push past it is left out, and closing stays possible. */
    fix_t f = {0};
    const char *toks[] = {"(", "((", "((((((((", ")", "))", "x", "()"};
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++)
        tv_adds(&f.tv, toks[i]);
    fix_open(&f, gbnf("root ::= \"(\" root \")\" | \"x\""));
    int depth = 0;
    while (1) {
        ck_assert_int_eq(mask_vs_brute(&f, "opening"), 0);
        if (!bit(f.mask, 0))
            break;
        ck_assert_int_eq(grammar_state_accept(f.s, bit(f.mask, 2) ? 2 : 0), 0);
        depth += bit(f.mask, 2) ? 8 : 1;
        ck_assert_int_lt(depth, 2 * GRAMMAR_MAX_DEPTH);
    }
    ck_assert_int_gt(depth, GRAMMAR_MAX_DEPTH / 2);
    ck_assert(bit(f.mask, 5)); /* x closes the innermost */
    ck_assert_int_eq(grammar_state_accept(f.s, 5), 0);
    ck_assert_int_eq(mask_vs_brute(&f, "closing"), 0);
    fix_close(&f);
    /* The generic JSON grammar: 300 '[' cannot all be taken. */
    grammar_t *g = NULL;
    ck_assert_int_eq(grammar_json_object(&g), 0);
    memset(&f, 0, sizeof f);
    tv_bytes(&f.tv);
    fix_open(&f, g);
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "{\"a\":", 5), 0);
    int opened = 0;
    while (opened < 300 && grammar_state_accept_bytes(f.s, "[", 1) == 0)
        opened++;
    ck_assert_int_lt(opened, 300);
    ck_assert_int_gt(opened, 60);
    ck_assert_int_eq(mask_vs_brute(&f, "json depth"), 0);
    ck_assert(bit(f.mask, ']'));
    fix_close(&f);
}
END_TEST

/* ---- states ----------------------------------------------------------------------------- */

START_TEST(test_stop_tokens_and_done)
{
    fix_t f;
    fix_bytes(&f, gbnf("root ::= \"a\" \"b\"?"));
    int stop = f.stop;
    ck_assert_int_eq(grammar_state_mask(f.s, f.mask), 0);
    ck_assert(!bit(f.mask, stop));
    ck_assert_int_eq(grammar_state_accept(f.s, stop), RIVER_EINVAL);
    ck_assert_int_eq(grammar_state_accept(f.s, 'a'), 0);
    ck_assert_int_eq(grammar_state_mask(f.s, f.mask), 0);
    ck_assert(bit(f.mask, stop) && bit(f.mask, 'b'));
    ck_assert(grammar_state_can_end(f.s) && !grammar_state_is_done(f.s));
    ck_assert_int_eq(grammar_state_accept(f.s, stop), 0);
    ck_assert(grammar_state_is_done(f.s));
    ck_assert_int_eq(grammar_state_mask(f.s, f.mask), 0);
    for (int t = 0; t <= stop; t++)
        ck_assert(!bit(f.mask, t));
    ck_assert_int_eq(grammar_state_accept(f.s, 'b'), RIVER_EINVAL);
    ck_assert_int_eq(grammar_state_accept(f.s, stop + 1), RIVER_ERANGE);
    fix_close(&f);
}
END_TEST

START_TEST(test_copy_and_rollback)
{
    fix_t f = {0};
    tv_jsonish(&f.tv, 5);
    fix_open(&f, schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":"
                        "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},\"required\":["
                        "\"a\",\"b\"]}"));
    size_t words = ((size_t)f.tv.n + 31) / 32;
    uint32_t *before = calloc(words, 4), *after = calloc(words, 4);
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "{\"a\": \"x", 8), 0);
    grammar_state_t *snap = NULL;
    ck_assert_int_eq(grammar_state_new(&snap, f.m), 0);
    ck_assert_int_eq(grammar_state_copy(snap, f.s), 0);
    ck_assert_int_eq(grammar_state_mask(f.s, before), 0);
    /* Speculate, then roll back. */
    const char *more = "yz\", \"b\": [1";
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, more, strlen(more)), 0);
    ck_assert_int_eq(grammar_state_mask(f.s, after), 0);
    ck_assert_int_ne(memcmp(before, after, words * 4), 0);
    ck_assert_int_eq(grammar_state_copy(f.s, snap), 0);
    ck_assert_int_eq(grammar_state_mask(f.s, after), 0);
    ck_assert_int_eq(memcmp(before, after, words * 4), 0);
    ck_assert_int_eq(mask_vs_brute(&f, "rolled back"), 0);
    /* A refused token leaves the state as it was. */
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "\"}", 2), RIVER_EINVAL);
    ck_assert_int_eq(grammar_state_mask(f.s, after), 0);
    ck_assert_int_eq(memcmp(before, after, words * 4), 0);
    /* States of another matcher do not mix. */
    fix_t o;
    fix_bytes(&o, gbnf("root ::= \"a\""));
    ck_assert_int_eq(grammar_state_copy(o.s, f.s), RIVER_EINVAL);
    fix_close(&o);
    grammar_state_destroy(&snap);
    free(before);
    free(after);
    fix_close(&f);
}
END_TEST

START_TEST(test_long_generation_stays_exact)
{
    /* Each character of a bounded string is a new position, so the state's pool grows and
     * is compacted on the way (GC_MIN); masks and copies must stay exact through it. */
    fix_t f = {0};
    tv_jsonish(&f.tv, 9);
    fix_open(&f, schema("{\"type\":\"string\",\"maxLength\":6000}"));
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "\"", 1), 0);
    grammar_state_t *snap = NULL;
    ck_assert_int_eq(grammar_state_new(&snap, f.m), 0);
    for (int i = 0; i < 5999; i++) {
        const char *piece = i % 3 ? "a" : "\xC3\xA9";
        ck_assert_int_eq(grammar_state_accept_bytes(f.s, piece, strlen(piece)), 0);
        if (i % 1500 == 1499) {
            ck_assert_int_eq(mask_vs_brute(&f, "long string"), 0);
            ck_assert_int_eq(grammar_state_copy(snap, f.s), 0);
        }
    }
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "b", 1), 0);
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "c", 1), RIVER_EINVAL); /* 6001st */
    ck_assert_int_eq(mask_vs_brute(&f, "full string"), 0);
    ck_assert_int_eq(grammar_state_accept_bytes(f.s, "\"", 1), 0);
    ck_assert(grammar_state_is_done(f.s));
    /* The snapshot taken after 4500 characters still has 1500 to go. */
    ck_assert_int_eq(grammar_state_copy(f.s, snap), 0);
    ck_assert_int_eq(mask_vs_brute(&f, "snapshot"), 0);
    grammar_state_destroy(&snap);
    fix_close(&f);
}
END_TEST

START_TEST(test_vocab_errors)
{
    const char *b[] = {"a", "bb"};
    size_t l[] = {1, 2};
    int32_t stop = 5;
    grammar_vocab_t *v = (grammar_vocab_t *)1;
    ck_assert_int_eq(grammar_vocab_new(&v, b, l, 0, NULL, 0), RIVER_EINVAL);
    ck_assert_ptr_null(v);
    ck_assert_int_eq(grammar_vocab_new(&v, b, l, 2, &stop, 1), RIVER_ERANGE);
    size_t big[] = {1, GRAMMAR_MAX_TOKEN_BYTES + 1};
    char *longtok = calloc(GRAMMAR_MAX_TOKEN_BYTES + 1, 1);
    const char *b2[] = {"a", longtok};
    ck_assert_int_eq(grammar_vocab_new(&v, b2, big, 2, NULL, 0), RIVER_ERANGE);
    free(longtok);
    ck_assert_int_eq(grammar_vocab_new(&v, b, l, 2, NULL, 0), 0);
    ck_assert_int_eq(grammar_vocab_size(v), 2);
    grammar_vocab_destroy(&v);
    ck_assert_ptr_null(v);
}
END_TEST

static Suite *grammar_suite(void)
{
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("grammar");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_gbnf_errors_name_line_column);
    tcase_add_test(tc, test_gbnf_literals_classes_repetition);
    tcase_add_test(tc, test_gbnf_escapes_comments_continuation);
    tcase_add_test(tc, test_utf8_classes);
    tcase_add_test(tc, test_partial_utf8_tokens);
    tcase_add_test(tc, test_tokens_spanning_elements);
    tcase_add_test(tc, test_mask_matches_reference_random_vocab);
    tcase_add_test(tc, test_mask_matches_reference_llama3_slice);
    tcase_add_test(tc, test_mask_matches_reference_llama3_document);
    tcase_add_test(tc, test_llama3_token_bytes);
    tcase_add_test(tc, test_schema_errors_name_paths);
    tcase_add_test(tc, test_schema_random_walks_validate);
    tcase_add_test(tc, test_schema_texts);
    tcase_add_test(tc, test_schema_to_gbnf_composes);
    tcase_add_test(tc, test_whitespace_is_bounded);
    tcase_add_test(tc, test_hostile_inputs_fail_cleanly);
    tcase_add_test(tc, test_depth_limit_is_exact);
    tcase_add_test(tc, test_stop_tokens_and_done);
    tcase_add_test(tc, test_copy_and_rollback);
    tcase_add_test(tc, test_long_generation_stays_exact);
    tcase_add_test(tc, test_vocab_errors);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(grammar_suite)
