#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "common/err.h"

typedef struct cand {
    float p;
    int32_t id;
} cand_t;

struct sampler {
    sampler_params_t p;
    int vocab;
    uint64_t state;
    cand_t *cand; /* (vocab) scratch */
};

int sampler_new(sampler_t **out, const sampler_params_t *p, int vocab_size)
{
    if (vocab_size <= 0)
        return river_err_set(RIVER_EINVAL, "sampler: vocab size %d", vocab_size);
    if (!(p->temperature == p->temperature) || p->temperature < 0)
        return river_err_set(RIVER_EINVAL, "sampler: temperature %g must be >= 0",
                             (double)p->temperature);
    if (p->top_k < 0)
        return river_err_set(RIVER_EINVAL, "sampler: top_k %d must be >= 0", p->top_k);
    if (!(p->top_p == p->top_p) || p->top_p < 0 || p->top_p > 1)
        return river_err_set(RIVER_EINVAL, "sampler: top_p %g must be in [0, 1]",
                             (double)p->top_p);
    sampler_t *s = calloc(1, sizeof *s);
    if (!s)
        return river_err_set(RIVER_ENOMEM, "sampler");
    s->cand = malloc(sizeof *s->cand * (size_t)vocab_size);
    if (!s->cand) {
        free(s);
        return river_err_set(RIVER_ENOMEM, "sampler: %d candidates", vocab_size);
    }
    s->p = *p;
    s->vocab = vocab_size;
    /* A zero state would stay zero under xorshift. */
    s->state = p->seed ? p->seed : 0x9E3779B97F4A7C15ull;
    *out = s;
    return 0;
}

void sampler_destroy(sampler_t **sp)
{
    if (!*sp)
        return;
    free((*sp)->cand);
    free(*sp);
    *sp = NULL;
}

int32_t sampler_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* xorshift64*: fast, and enough for sampling. Returns a float in [0, 1). */
static float sampler__uniform(sampler_t *s)
{
    s->state ^= s->state >> 12;
    s->state ^= s->state << 25;
    s->state ^= s->state >> 27;
    uint32_t r = (uint32_t)((s->state * 0x2545F4914F6CDD1Dull) >> 32);
    return (float)(r >> 8) / 16777216.0f;
}

void sampler_skip(sampler_t *s, uint64_t n)
{
    /* sampler_sample draws exactly one number per call when it samples at all. */
    if (s->p.temperature <= 0)
        return;
    while (n--)
        (void)sampler__uniform(s);
}

static int cand__desc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* Fills s->cand[0..*m) with the candidates that survive temperature, top-k and top-p, as
 * unnormalised weights summing to *sum. */
static void sampler__filter(sampler_t *s, const float *logits, int *m_out, double *sum_out)
{
    int n = s->vocab;
    /* Softmax of logits / T, kept as unnormalised weights. */
    float mx = logits[sampler_argmax(logits, n)];
    float inv_t = 1.0f / s->p.temperature;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float w = expf((logits[i] - mx) * inv_t);
        s->cand[i].p = w;
        s->cand[i].id = i;
        sum += w;
    }
    int m = n;
    int k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : 0;
    int use_p = s->p.top_p > 0 && s->p.top_p < 1;
    if (k || use_p) {
        /* Only candidates that can survive are sorted: with top-p, a token whose weight is
         * below (1-p)/(n-1) of the total can never be inside the nucleus. */
        if (use_p && !k) {
            float cut = (float)((1.0 - s->p.top_p) / (n - 1) * sum);
            m = 0;
            for (int i = 0; i < n; i++)
                if (s->cand[i].p >= cut)
                    s->cand[m++] = s->cand[i];
        }
        qsort(s->cand, (size_t)m, sizeof *s->cand, cand__desc);
        if (k && k < m)
            m = k;
        double kept = 0;
        for (int i = 0; i < m; i++)
            kept += s->cand[i].p;
        if (use_p) {
            double acc = 0;
            int last = m - 1;
            for (int i = 0; i < m; i++) {
                acc += s->cand[i].p;
                if (acc >= s->p.top_p * kept) {
                    last = i;
                    break;
                }
            }
            m = last + 1;
            kept = 0;
            for (int i = 0; i < m; i++)
                kept += s->cand[i].p;
        }
        sum = kept;
    }
    *m_out = m;
    *sum_out = sum;
}

int32_t sampler_sample(sampler_t *s, const float *logits)
{
    if (s->p.temperature <= 0)
        return sampler_argmax(logits, s->vocab);
    int m;
    double sum;
    sampler__filter(s, logits, &m, &sum);
    double r = (double)sampler__uniform(s) * sum;
    double acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->cand[i].p;
        if (r < acc)
            return s->cand[i].id;
    }
    return s->cand[m - 1].id;
}

int sampler_is_greedy(const sampler_t *s) { return s->p.temperature <= 0; }

void sampler_probs(sampler_t *s, const float *logits, float *probs)
{
    int n = s->vocab;
    for (int i = 0; i < n; i++)
        probs[i] = 0;
    if (s->p.temperature <= 0) {
        probs[sampler_argmax(logits, n)] = 1;
        return;
    }
    int m;
    double sum;
    sampler__filter(s, logits, &m, &sum);
    for (int i = 0; i < m; i++)
        probs[s->cand[i].id] = (float)(s->cand[i].p / sum);
}

float sampler_uniform(sampler_t *s) { return sampler__uniform(s); }

int32_t sampler_pick(sampler_t *s, const float *probs)
{
    double sum = 0;
    int last = -1;
    for (int i = 0; i < s->vocab; i++)
        if (probs[i] > 0) {
            sum += probs[i];
            last = i;
        }
    if (last < 0)
        return sampler_argmax(probs, s->vocab);
    double r = (double)sampler__uniform(s) * sum, acc = 0;
    for (int i = 0; i <= last; i++) {
        acc += probs[i];
        if (probs[i] > 0 && r < acc)
            return i;
    }
    return last;
}
