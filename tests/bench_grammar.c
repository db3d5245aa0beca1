/* Benchmark of the grammar engine's token masks (text/grammar.h) over the Llama 3 vocabulary
 * (`make bench-grammar`): for several JSON Schemas, the time to build the matcher, then the
 * time of every grammar_state_mask call of realistic generations, one core:
 *   document  a valid document, pretty-printed, followed token by token in the tokenizer's
 *             own tokenization, RUNS times, each with a fresh state;
 *   random    seeded walks that take a uniformly random allowed token at each step (so
 *             strings fill with arbitrary tokens), up to STEPS tokens.
 * It prints median, p90, p99 and max per schema and mode. Not a test: nothing here fails
 * on a slow machine; a wrong mask (a document token refused) is an error.
 *
 * Usage: bench_grammar [tokenizer.json]   (default: the Llama 3 one under tests/data) */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

#define RUNS 5
#define WALKS 5
#define STEPS 300

typedef struct bench_case {
    const char *name;
    const char *schema; /* NULL: grammar_json_object */
    const char *doc;
} bench_case_t;

static const bench_case_t cases[] = {
    {"person",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
     "\"integer\",\"minimum\":0},\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z0-9.]+@[a-z]+"
     "\\\\.[a-z]{2,3}$\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
     "\"required\":[\"name\",\"age\",\"email\",\"tags\"],\"additionalProperties\":false}",
     "{\n  \"name\": \"Ada Lovelace, Countess of Lovelace\",\n  \"age\": 36,\n"
     "  \"email\": \"ada.lovelace@analytical.org\",\n"
     "  \"tags\": [\"mathematician\", \"writer\", \"first programmer\"]\n}"},
    {"order",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\","
     "\"pattern\":\"^ORD-[0-9]{6}$\"},"
     "\"status\":{\"enum\":[\"pending\",\"shipped\",\"delivered\",\"cancelled\"]},"
     "\"customer\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
     "\"maxLength\":80},\"address\":{\"type\":\"string\",\"maxLength\":200},\"vip\":{\"type\":"
     "\"boolean\"}},\"required\":[\"name\",\"address\"],\"additionalProperties\":false},"
     "\"lines\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":20,\"items\":{\"type\":\"object\","
     "\"properties\":{\"sku\":{\"type\":\"string\"},\"qty\":{\"type\":\"integer\",\"minimum\":0},"
     "\"price\":{\"type\":\"number\"},\"note\":{\"type\":[\"string\",\"null\"]}},\"required\":["
     "\"sku\",\"qty\",\"price\",\"note\"],\"additionalProperties\":false}},\"total\":{\"type\":"
     "\"number\"}},\"required\":[\"id\",\"status\",\"customer\",\"lines\",\"total\"],"
     "\"additionalProperties\":false}",
     "{\n  \"id\": \"ORD-004217\",\n  \"status\": \"shipped\",\n  \"customer\": {\n"
     "    \"name\": \"Jürgen Müller\",\n    \"address\": \"Hauptstraße 12, 10115 Berlin, "
     "Germany (ring twice, leave the parcel with the neighbours if nobody answers)\",\n"
     "    \"vip\": true\n  },\n  \"lines\": [\n    {\"sku\": \"KB-102\", \"qty\": 2, \"price\": "
     "49.9, \"note\": null},\n    {\"sku\": \"MS-7\", \"qty\": 1, \"price\": 19.5, \"note\": "
     "\"gift wrap, \\\"Happy birthday!\\\"\"}\n  ],\n  \"total\": 119.3\n}"},
    {"tool_call",
     "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},"
     "\"arguments\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
     "\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},"
     "\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}},\"required\":[\"name\","
     "\"arguments\"],\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{"
     "\"name\":{\"const\":\"search\"},\"arguments\":{\"type\":\"object\",\"properties\":{"
     "\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\"}},\"required\":[\"query\"],"
     "\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"],"
     "\"additionalProperties\":false}]}",
     "{\"name\": \"search\", \"arguments\": {\"query\": \"cheapest flights from Lisbon to Tokyo in "
     "late October, with at most one stop\", \"limit\": 5}}"},
    {"tree",
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"label\":{\"type\":\"string\"},"
     "\"weight\":{\"type\":\"number\"},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":"
     "\"#/$defs/node\"}}},\"required\":[\"label\",\"children\"],\"additionalProperties\":false}},"
     "\"$ref\":\"#/$defs/node\"}",
     "{\"label\": \"root\", \"weight\": 1.0, \"children\": [{\"label\": \"left\", \"children\": "
     "[{\"label\": \"left.a\", \"weight\": 0.25, \"children\": []}]}, {\"label\": \"right\", "
     "\"weight\": 2.5e-1, \"children\": [{\"label\": \"right.b\", \"children\": [{\"label\": "
     "\"deep\", \"children\": []}]}]}]}"},
    {"json_object", NULL,
     "{\n  \"model\": \"river\",\n  \"scores\": [0.91, 0.07, 0.02],\n  \"meta\": {\"ok\": true, "
     "\"note\": null, \"text\": \"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed "
     "do eiusmod tempor incididunt ut labore et dolore magna aliqua.\"},\n  \"nested\": [[1, "
     "[2, [3]]], {\"a\": {\"b\": {\"c\": \"d\"}}}]\n}"},
};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, const char *mode, double build_ms, double *t, size_t n)
{
    if (n == 0)
        return;
    qsort(t, n, sizeof *t, cmp_double);
    printf("%-12s %9.1f  %-8s %6zu  %9.4f  %8.4f  %8.4f  %8.4f\n", name, build_ms, mode, n,
           t[n / 2], t[(size_t)(n * 0.90)], t[(size_t)(n * 0.99)], t[n - 1]);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/data/tokenizers/llama3/tokenizer.json";
    /* One core: the mask is single-threaded; pinning keeps the figures steady. */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    sched_setaffinity(0, sizeof one, &one);

    tokenizer_t *tok = NULL;
    if (tokenizer_load(&tok, path, 0)) {
        fprintf(stderr, "bench_grammar: %s\n", river_err_detail());
        return 1;
    }
    int n = tokenizer_vocab_size(tok);
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    char buf[4096];
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        if (tokenizer_is_special(tok, i) || tokenizer_token_bytes(tok, i, buf, sizeof buf, &len))
            continue;
        bytes[i] = malloc(len + 1);
        memcpy(bytes[i], buf, len);
        lens[i] = len;
    }
    int32_t stop = tokenizer_eos_id(tok);
    double t0 = now_ms();
    grammar_vocab_t *v = NULL;
    if (grammar_vocab_new(&v, (const char *const *)bytes, lens, n, &stop, stop >= 0)) {
        fprintf(stderr, "bench_grammar: %s\n", river_err_detail());
        return 1;
    }
    printf("vocabulary: %d tokens from %s, trie built in %.1f ms\n", n, path, now_ms() - t0);
    printf("%-12s %9s  %-8s %6s  %9s  %8s  %8s  %8s\n", "schema", "build_ms", "mode", "masks",
           "median_ms", "p90_ms", "p99_ms", "max_ms");
    uint32_t *mask = malloc(((size_t)n + 31) / 32 * sizeof *mask);
    double *times = malloc((size_t)(RUNS * 4096 + WALKS * STEPS + 16) * sizeof *times);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    int failed = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const bench_case_t *c = &cases[ci];
        grammar_t *g = NULL;
        int err = c->schema ? grammar_from_json_schema(&g, c->schema, strlen(c->schema))
                            : grammar_json_object(&g);
        grammar_matcher_t *m = NULL;
        double b0 = now_ms();
        if (!err)
            err = grammar_matcher_new(&m, g, v);
        double build = now_ms() - b0;
        if (err) {
            fprintf(stderr, "bench_grammar: %s: %s\n", c->name, river_err_detail());
            failed = 1;
            grammar_destroy(&g);
            continue;
        }
        int32_t *ids = NULL;
        size_t n_ids = 0, nt = 0;
        if (tokenizer_encode(tok, c->doc, strlen(c->doc), 0, &ids, &n_ids)) {
            fprintf(stderr, "bench_grammar: %s: %s\n", c->name, river_err_detail());
            return 1;
        }
        for (int run = 0; run < RUNS && !failed; run++) {
            grammar_state_t *s = NULL;
            grammar_state_new(&s, m);
            for (size_t i = 0; i <= n_ids && nt < (size_t)RUNS * 4096; i++) {
                double a = now_ms();
                err = grammar_state_mask(s, mask);
                times[nt++] = now_ms() - a;
                int32_t t = i < n_ids ? ids[i] : stop;
                if (err || !(mask[t / 32] >> (t % 32) & 1) || grammar_state_accept(s, t)) {
                    fprintf(stderr, "bench_grammar: %s: document token %zu (%d) refused: %s\n",
                            c->name, i, (int)t, river_err_detail());
                    failed = 1;
                    break;
                }
            }
            grammar_state_destroy(&s);
        }
        report(c->name, "document", build, times, nt);
        nt = 0;
        for (int walk = 0; walk < WALKS; walk++) {
            uint64_t rng = 0x9E3779B97F4A7C15ULL * (uint64_t)(walk + 1);
            grammar_state_t *s = NULL;
            grammar_state_new(&s, m);
            for (int step = 0; step < STEPS; step++) {
                double a = now_ms();
                if (grammar_state_mask(s, mask)) {
                    fprintf(stderr, "bench_grammar: %s: %s\n", c->name, river_err_detail());
                    failed = 1;
                    break;
                }
                times[nt++] = now_ms() - a;
                int k = 0;
                for (int t = 0; t < n; t++)
                    if (t != stop && (mask[t / 32] >> (t % 32) & 1))
                        allowed[k++] = t;
                if (k == 0 || grammar_state_accept(s, allowed[xorshift(&rng) % (uint64_t)k]))
                    break;
            }
            grammar_state_destroy(&s);
        }
        report(c->name, "random", build, times, nt);
        free(ids);
        grammar_matcher_destroy(&m);
        grammar_destroy(&g);
    }
    free(times);
    free(mask);
    free(allowed);
    grammar_vocab_destroy(&v);
    for (int i = 0; i < n; i++)
        free(bytes[i]);
    free(bytes);
    free(lens);
    tokenizer_destroy(&tok);
    return failed;
}
