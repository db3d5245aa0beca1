/* The AVX2 + FMA + F16C kernels. Compiled with those flags and only ever called after
 * cpu_simd_detect() found them. The structure follows kernels_avx512.c with 8-wide vectors
 * and half the registers, so the tiles are smaller. AVX2 has masked loads for 32-bit lanes
 * only, so the 16-bit weight tails go through a scalar loop. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/q4x8.h"
#include "kernels/cpu/rowblock.h"
#include "kernels/cpu/peak_rounds.h"
#include "kernels/cpu/simd.h"
#include "kernels/half.h"
#include "kernels/kv_row.h"

#define AI static inline __attribute__((always_inline))

/* Decode: weight rows per block and the most x rows per tile; with 16 registers a tile
 * holds at most 12 accumulators (3 x 4 for float weights against four rows of x; 8 x 1 or
 * 4 x 2 against fewer; fewer for Q4/Q8, whose scales and zeros take registers too). The
 * next block is prefetched as in the AVX-512 kernels. */
#define GEMV_R 8
#define GEMV_N 2
#define GEMV_NF 4 /* float weights against 4 x rows: 3 x 4 tiles */
#define GEMV_NQ8 4 /* the Q4/Q8 tiles with 8-bit x: up to 2 x 4 */
#define GEMM_P 16
#define GEMM_R 6

#include "kernels/cpu/x86_util.h"

/* A lane mask of the first `left` (0..8) lanes, for maskload/maskstore. */
AI __m256i mask8(int64_t left)
{
    static const int32_t m[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
    return _mm256_loadu_si256((const __m256i *)(m + 8 - left));
}

AI __m256 ld8(dtype_t dt, const uint8_t *row, int64_t k)
{
    switch (dt) {
    case DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
    case DTYPE_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    default:
        return _mm256_loadu_ps((const float *)row + k);
    }
}

/* 16 bf16 weights (a block of 16 columns) as f32: the even columns, and the odd ones. The
 * section "bf16 weights in even/odd order" says why. */
AI __m256 eo_even(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

AI __m256 eo_odd(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Vector s of bf16 weights in even/odd order, counted from a block of 16 columns; p is
 * where vector s of the plain order starts. */
AI __m256 ld8_eo(const uint8_t *p, int64_t s)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)(p - (s & 1) * 16));
    return (s & 1) ? eo_odd(v) : eo_even(v);
}

AI float ld1(dtype_t dt, const uint8_t *row, int64_t k)
{
    switch (dt) {
    case DTYPE_F16:
        return f16_to_f32(((const uint16_t *)row)[k]);
    case DTYPE_BF16:
        return bf16_to_f32(((const uint16_t *)row)[k]);
    default:
        return ((const float *)row)[k];
    }
}

/* 8 codes of a Q4/Q8 row from column k (a multiple of 8), as f32. */
AI __m256 ld8_codes(dtype_t dt, const uint8_t *row, int64_t k)
{
    __m128i c;
    if (dt == DTYPE_Q8) {
        c = _mm_loadl_epi64((const __m128i *)(row + k));
    } else {
        int32_t four;
        memcpy(&four, row + k / 2, sizeof four);
        __m128i b = _mm_cvtsi32_si128(four);
        __m128i mask = _mm_set1_epi8(0x0f);
        __m128i lo = _mm_and_si128(b, mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
        c = _mm_unpacklo_epi8(lo, hi);
    }
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
}

/* ---- decode ----------------------------------------------------------------------------- */

/* Prefetches the lines R rows need pf bytes ahead of column k, when columns k.. begin a
 * line (called every 8 columns). */
AI void gemv_prefetch(const uint8_t *w, size_t rb, int64_t k, int64_t pf, const dtype_t dt,
                      const int R)
{
    int64_t byte = dt == DTYPE_F32 ? k * 4 : dt == DTYPE_Q8 ? k : dt == DTYPE_Q4 ? k / 2 : k * 2;
    int64_t step = dt == DTYPE_F32 ? 32 : dt == DTYPE_Q8 ? 8 : dt == DTYPE_Q4 ? 4 : 16;
    if ((byte & 63) >= step)
        return;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        _mm_prefetch((const char *)(w + r * rb + byte + pf), _MM_HINT_T0);
}

/* Byte offset of column k (a multiple of 8) in a row whose 64-byte chunks are cs bytes
 * apart (rowblock.h: 64 in the row-major layout, which makes it k's plain offset). */
AI size_t col_off(int64_t k, size_t cs, const dtype_t dt)
{
    int64_t es = dt == DTYPE_F32 ? 4 : 2, per = CPU_ROWBLOCK_CHUNK / es;
    return (size_t)(k / per) * cs + (size_t)(k % per * es);
}

/* R float weight rows (rb bytes apart, starting at w, their 64-byte chunks cs bytes apart:
 * rowblock.h) against N rows of x; pf > 0 prefetches (the row-major layout only). */
AI void gemv_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const uint8_t *w,
                  size_t rb, size_t cs, int64_t cols, int64_t pf, const dtype_t dt,
                  const int R, const int N)
{
    __m256 acc[GEMV_R][GEMV_NF];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= cols; k += 8) {
        if (pf)
            gemv_prefetch(w, rb, k, pf, dt, R);
        const uint8_t *wk = w + col_off(k, cs, dt);
        if (cs != CPU_ROWBLOCK_CHUNK && col_off(k, CPU_ROWBLOCK_CHUNK, dt) % CPU_ROWBLOCK_CHUNK == 0)
            cpu_rowblock_prefetch(wk, R); /* row-blocked: at each chunk's start */
        /* Against four rows of x (3 x 4 uses all 16 registers: 12 accumulators, the three
         * converted weight vectors, one x vector) each weight vector is converted first
         * and each x vector loaded once; with fewer rows (8 x 1, 4 x 2) the x vectors are
         * held and each weight vector converted in turn. */
        if (N >= 4) {
            __m256 wv[GEMV_R];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                wv[r] = ld8(dt, wk + r * rb, 0);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    acc[r][i] = _mm256_fmadd_ps(wv[r], xv, acc[r][i]);
            }
            continue;
        }
        __m256 xv[GEMV_NF];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            xv[i] = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 wv = ld8(dt, wk + r * rb, 0);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            float s = hsum8(acc[r][i]);
            /* Only row-major rows have a tail: row-blocked ones are whole chunks. */
            for (int64_t kk = k; kk < cols; kk++)
                s += ld1(dt, w + r * rb, kk) * x[i * ldx + kk];
            y[i * ldy + r] = s;
        }
}

AI void gemv_tile_q(float *y, int64_t ldy, const float *x, int64_t ldx, const uint8_t *w,
                    size_t rb, const weight_t *wt, int64_t r0, int64_t pf, const dtype_t dt,
                    const int R, const int N)
{
    int64_t cols = wt->cols;
    int group = wt->group;
    int64_t ng = cols / group;
    __m256 acc[GEMV_R][GEMV_N];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256 sc[GEMV_R], ze[GEMV_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            sc[r] = _mm256_set1_ps(_cvtsh_ss(wt->scales[(r0 + r) * ng + g]));
            ze[r] = _mm256_set1_ps(_cvtsh_ss(wt->zeros[(r0 + r) * ng + g]));
        }
        for (int64_t k = g * group; k < (g + 1) * group; k += 8) {
            if (pf)
                gemv_prefetch(w, rb, k, pf, dt, R);
            __m256 xv[GEMV_N];
#pragma GCC unroll 2
            for (int i = 0; i < N; i++)
                xv[i] = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256 q = ld8_codes(dt, w + r * rb, k);
                __m256 wv = _mm256_mul_ps(_mm256_sub_ps(q, ze[r]), sc[r]);
#pragma GCC unroll 2
                for (int i = 0; i < N; i++)
                    acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum8(acc[r][i]);
}

AI void gemv_tile_any(float *y, int64_t ldy, const float *x, int64_t ldx, const weight_t *w,
                      size_t rb, int64_t r, int i, int64_t pf, const dtype_t dt, const int R,
                      const int N)
{
    if (cpu_rowblock_is(w->dtype)) {
        gemv_tile(y + i * ldy + r, ldy, x + i * ldx, ldx, cpu_rowblock_at(w->data, rb, r, 0),
                  CPU_ROWBLOCK_CHUNK, CPU_ROWBLOCK_SPAN, w->cols, 0, dt, R, N);
        return;
    }
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;
    if (dt == DTYPE_Q4 || dt == DTYPE_Q8)
        gemv_tile_q(y + i * ldy + r, ldy, x + i * ldx, ldx, wr, rb, w, r, pf, dt, R, N);
    else
        gemv_tile(y + i * ldy + r, ldy, x + i * ldx, ldx, wr, rb, CPU_ROWBLOCK_CHUNK, w->cols,
                  pf, dt, R, N);
}

/* One block of R rows against all n rows of x, GEMV_N at a time, in sub-blocks that fit
 * the registers; the first pass prefetches the next block. */
AI void gemv_rows(float *y, int64_t ldy, const float *x, int64_t ldx, int n, const weight_t *w,
                  int64_t r, int64_t pf, const dtype_t dt, const int R)
{
    size_t rb = dtype_row_bytes(dt, w->cols);
    int quant = dt == DTYPE_Q4 || dt == DTYPE_Q8;
    int i = 0;
    /* Four x rows at a time for float weights, in two 3 x 4 tiles and a 2 x 4 for the
     * block's last two rows: a tile converts each weight vector once for four FMAs, and
     * the 12 accumulators of a 3 x 4 tile are 12 chains of dependent FMAs, enough to keep
     * both FMA units busy through their latency where the 8 of a 2 x 4 tile were not (a
     * Llama 3.2 1B layer at 8 rows from memory: 7.6-7.7 against 8.5-8.8 ms, AVX2). */
    if (!quant && R == GEMV_R)
        for (; n - i >= 4; i += 4) {
            int64_t p = i == 0 ? pf : 0;
            gemv_tile_any(y, ldy, x, ldx, w, rb, r, i, p, dt, 3, 4);
            gemv_tile_any(y, ldy, x, ldx, w, rb, r + 3, i, p, dt, 3, 4);
            gemv_tile_any(y, ldy, x, ldx, w, rb, r + 6, i, p, dt, 2, 4);
        }
    for (; i < n; i += GEMV_N) {
        int64_t p = i == 0 ? pf : 0;
        int two = n - i >= 2;
        /* Rows per tile: 8 accumulators for floats; Q4/Q8 also hold a scale and a zero per
         * row, so 4 rows for one x row and 2 for two. */
        int sub = quant ? (two ? 2 : 4) : (two ? 4 : 8);
        if (R < sub)
            sub = R;
        for (int h = 0; h < R; h += sub) {
            if (sub == 8)
                gemv_tile_any(y, ldy, x, ldx, w, rb, r + h, i, p, dt, 8, 1);
            else if (sub == 4 && two)
                gemv_tile_any(y, ldy, x, ldx, w, rb, r + h, i, p, dt, 4, 2);
            else if (sub == 4)
                gemv_tile_any(y, ldy, x, ldx, w, rb, r + h, i, p, dt, 4, 1);
            else if (sub == 2 && two)
                gemv_tile_any(y, ldy, x, ldx, w, rb, r + h, i, p, dt, 2, 2);
            else if (sub == 2)
                gemv_tile_any(y, ldy, x, ldx, w, rb, r + h, i, p, dt, 2, 1);
            else if (two)
                gemv_tile_any(y, ldy, x, ldx, w, rb, r + h, i, p, dt, 1, 2);
            else
                gemv_tile_any(y, ldy, x, ldx, w, rb, r + h, i, p, dt, 1, 1);
        }
        if (!two)
            break;
    }
}

#define GEMV_DEFINE(name, DT)                                                                \
    static void name(float *y, int64_t ldy, const float *x, int64_t ldx, int n,             \
                     const weight_t *w, int64_t r0, int64_t r1)                             \
    {                                                                                       \
        int64_t pf = (int64_t)GEMV_R * (int64_t)dtype_row_bytes(DT, w->cols);               \
        int64_t r = r0;                                                                     \
        for (; r + GEMV_R <= r1; r += GEMV_R)                                               \
            gemv_rows(y, ldy, x, ldx, n, w, r, r + 2 * GEMV_R <= r1 ? pf : 0, DT, GEMV_R);  \
        for (; r < r1; r++)                                                                 \
            gemv_rows(y, ldy, x, ldx, n, w, r, 0, DT, 1);                                   \
    }

GEMV_DEFINE(gemv_f32, DTYPE_F32)
GEMV_DEFINE(gemv_f16, DTYPE_F16)
GEMV_DEFINE(gemv_bf16, DTYPE_BF16)
GEMV_DEFINE(gemv_q8, DTYPE_Q8)
GEMV_DEFINE(gemv_q4, DTYPE_Q4)

/* ---- decode of Q4/Q8 with 8-bit activations --------------------------------------------- */

/* Q4/Q8 weights whose groups hold whole blocks of 32 columns take integer dot products:
 * gemv_prep quantizes each row of x once per call to 8 bits in blocks of 32 columns
 * (llama.cpp's q8_0: d = max|x| / 127, x8 = round(x * 127 / max|x|), ties to even), and
 * a block's dot product with the codes is exact in 32-bit integers (vpmaddubsw,
 * vpmaddwd). With w = s (q - z) per group and x^ = d x8,
 *     y = sum_groups s * (sum_blocks d * (q . x8) - z * sum_blocks d * sum(x8)),
 * which is W x^ exactly, zero points included (f32 rounding aside): the only
 * approximation is x ~= x^, |x - x^| <= max|x| / 254 per element of a block, hence
 * |y - W x| <= sum over blocks of (max|x| / 254) * sum |w| (tests/test_backend_ops.c
 * checks both). For Q4 a block of x is 32 columns, or 64 where the groups are multiples of
 * 64 (q8_xblock); Q8 takes the kernel shared with the AVX-512 level (q8_x86.h: blocks of
 * 32, the sign trick on q - 128, no zero terms for symmetric weights).
 *
 * xq holds, per row of x (ldq floats), for Q4: cols int8 codes (cols / 4 floats; each
 * block holds its even columns, then its odd ones, the order in which the nibbles come
 * out of the bytes), then the block scales d (room for cols / 32), then per group
 * sum d * sum(x8) (padded with zeros to a multiple of 8). */
#define Q8_BLOCK 32

static int q8_path(const weight_t *w)
{
    return w->dtype == DTYPE_Q4 && w->group % Q8_BLOCK == 0;
}

/* Columns per block of x: 64 where the groups allow it (Q4 codes of two 32-column halves
 * then come out of one 32-byte load, and the 16-bit pair sums of both halves are added
 * before widening: at most 2 * 2 * 15 * 127 = 7620), else 32. */
static int q8_xblock(const weight_t *w)
{
    return w->group % 64 == 0 ? 64 : 32;
}

/* Eight fp16 values from p, the ones past `left` read as 0. */
AI __m256 ld8_f16_tail(const uint16_t *p, int64_t left)
{
    if (left >= 8)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    uint16_t t[8] = { 0 };
    memcpy(t, p, (size_t)left * sizeof *t);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

#define Q4X8_FN(name) avx2_q4x8_##name
#define Q4X8_VNNI 0
#include "kernels/cpu/q4x8_x86.h"
#undef Q4X8_FN
#undef Q4X8_VNNI

#define Q8_FN(name) avx2_q8_##name
#define Q8_VNNI 0
#define Q8_Q4X8(name) avx2_q4x8_##name
#include "kernels/cpu/q8_x86.h"
#undef Q8_FN
#undef Q8_VNNI
#undef Q8_Q4X8

static int64_t avx2_gemv_prep_floats(const weight_t *w)
{
    if (w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8)
        return avx2_q4x8_prep_floats(w);
    if (cpu_q8_int_eligible(w))
        return avx2_q8_prep_floats(w);
    if (!q8_path(w))
        return 0;
    int64_t ng = w->cols / w->group;
    int64_t f = w->cols / 4 + w->cols / Q8_BLOCK + (ng + 7) / 8 * 8;
    return (f + 15) / 16 * 16; /* rows stay 64-byte aligned */
}

static int avx2_gemv_x8_block(const weight_t *w)
{
    if (w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8 || cpu_q8_int_eligible(w))
        return 32;
    return q8_path(w) ? q8_xblock(w) : 0;
}

static void avx2_gemv_prep(float *xq, const float *x, int64_t ldx, int n, const weight_t *w)
{
    if (w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8) {
        avx2_q4x8_prep(xq, x, ldx, n, w);
        return;
    }
    if (cpu_q8_int_eligible(w)) {
        avx2_q8_prep(xq, x, ldx, n, w);
        return;
    }
    int64_t ldq = avx2_gemv_prep_floats(w), cols = w->cols;
    int xb = q8_xblock(w);
    int64_t nb = cols / xb, ng = cols / w->group, bpg = w->group / xb;
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * ldx;
        float *qi = xq + i * ldq;
        int8_t *x8 = (int8_t *)qi;
        float *d = qi + cols / 4, *xs = d + cols / Q8_BLOCK;
        for (int64_t b = 0; b < nb; b++) {
            const float *xb0 = xi + b * xb;
            float amax = x86_absmax(xb0, xb);
            d[b] = amax / 127.0f;
            __m256 iv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            _Alignas(32) int8_t t[64];
            for (int h32 = 0; h32 < xb; h32 += 32)
                x86_pack32(t + h32, xb0 + h32, iv);
            int8_t *o = x8 + b * xb;
            int sum = 0;
            for (int j = 0; j < xb; j++)
                sum += t[j];
            for (int j = 0; j < xb / 2; j++) {
                o[j] = t[2 * j];
                o[xb / 2 + j] = t[2 * j + 1];
            }
            if (b % bpg == 0)
                xs[b / bpg] = 0.0f;
            xs[b / bpg] += d[b] * (float)sum;
        }
        for (int64_t g = ng; g < (ng + 7) / 8 * 8; g++)
            xs[g] = 0.0f;
    }
}


/* The 32 codes of block k (a multiple of 32) of a Q4 row as bytes: the 16 low nibbles
 * (even columns), then the 16 high ones (odd columns). */
AI __m256i ld32_q4(const uint8_t *row, int64_t k)
{
    __m128i b = _mm_loadu_si128((const __m128i *)(row + k / 2));
    __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* The integer dot product of R weight rows with N rows of x8 over one x block of XB
 * columns from column k, as 8 int32 lanes each. */
AI void q8_block_dots(__m256i dot[GEMV_R][GEMV_NQ8], const uint8_t *w, size_t rb,
                      const int8_t *x8, int64_t ldq8, int64_t k, const dtype_t dt, const int XB,
                      const int R, const int N)
{
    const __m256i ones = _mm256_set1_epi16(1);
    (void)dt; /* Q4: Q8 takes q8_x86.h */
    __m256i xv[GEMV_NQ8], xv2[GEMV_NQ8];
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) {
        xv[i] = _mm256_loadu_si256((const __m256i *)(x8 + i * ldq8 + k));
        if (XB == 64)
            xv2[i] = _mm256_loadu_si256((const __m256i *)(x8 + i * ldq8 + k + 32));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (XB == 64) {
            /* 32 bytes: the low nibbles are the 32 even columns, the high the odd. */
            __m256i b = _mm256_loadu_si256((const __m256i *)(w + r * rb + k / 2));
            __m256i m = _mm256_set1_epi8(0x0f);
            __m256i lo = _mm256_and_si256(b, m);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                dot[r][i] = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo, xv[i]),
                                     _mm256_maddubs_epi16(hi, xv2[i])), ones);
        } else {
            __m256i wq = ld32_q4(w + r * rb, k);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                dot[r][i] = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xv[i]), ones);
        }
    }
}

/* R weight rows (from row r0 of wt, rb bytes apart at w) against N rows of xq. */
AI void gemv_tile_q8(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                     size_t rb, const weight_t *wt, int64_t r0, int64_t pf, const dtype_t dt,
                     const int XB, const int R, const int N)
{
    int64_t cols = wt->cols;
    int group = wt->group;
    int64_t ng = cols / group;
    const int8_t *x8 = (const int8_t *)xq;
    const float *xd = xq + cols / 4, *xs = xd + cols / Q8_BLOCK;
    __m256 acc[GEMV_R][GEMV_NQ8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    avx2_q4x8_zero_terms(acc, wt, r0, ng, xs, ldq, 0.0f, R, N);
    for (int64_t g = 0; g < ng; g++) {
        __m256 sc[GEMV_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            sc[r] = _mm256_set1_ps(_cvtsh_ss(wt->scales[(r0 + r) * ng + g]));
        for (int64_t k = g * group; k < (g + 1) * group; k += XB) {
            if (pf) {
                /* Prefetch each line once: a line is 128 Q4 columns, 64 Q8 ones. */
                int64_t byte = dt == DTYPE_Q4 ? k / 2 : k;
                if ((byte & 63) < (dt == DTYPE_Q4 ? XB / 2 : XB))
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++)
                        _mm_prefetch((const char *)(w + r * rb + byte + pf), _MM_HINT_T0);
            }
            __m256i dot[GEMV_R][GEMV_NQ8];
            q8_block_dots(dot, w, rb, x8, ldq * 4, k, dt, XB, R, N);
            int64_t b = k / XB;
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                __m256 dv = _mm256_broadcast_ss(xd + i * ldq + b);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][i]),
                                                _mm256_mul_ps(sc[r], dv), acc[r][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum8(acc[r][i]);
}

AI void gemv_tile_q8x(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                      size_t rb, const weight_t *wt, int64_t r0, int64_t pf, const dtype_t dt,
                      const int R, const int N)
{
    if (wt->group % 64 == 0)
        gemv_tile_q8(y, ldy, xq, ldq, w, rb, wt, r0, pf, dt, 64, R, N);
    else
        gemv_tile_q8(y, ldy, xq, ldq, w, rb, wt, r0, pf, dt, 32, R, N);
}

/* One block of R weight rows against all n rows of xq: tiles of 8 x 1, 4 x 2 or 2 x 4
 * (at most 8 accumulators, the x codes and scales taking the other registers); the block
 * stays in L1 between the tiles, and the first tile prefetches the next block. */
AI void gemv_rows_q8(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                     const weight_t *w, int64_t r, int64_t pf, const dtype_t dt, const int R)
{
    size_t rb = dtype_row_bytes(dt, w->cols);
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;
    for (int i = 0; i < n;) {
        int64_t p = i == 0 ? pf : 0;
        float *yi = y + i * ldy + r;
        const float *qi = xq + i * ldq;
        int left = n - i;
        if (R == 1) {
            int nn = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            if (nn == 4)
                gemv_tile_q8x(yi, ldy, qi, ldq, wr, rb, w, r, p, dt, 1, 4);
            else if (nn == 2)
                gemv_tile_q8x(yi, ldy, qi, ldq, wr, rb, w, r, p, dt, 1, 2);
            else
                gemv_tile_q8x(yi, ldy, qi, ldq, wr, rb, w, r, p, dt, 1, 1);
            i += nn;
        } else if (left >= 4) {
            for (int h = 0; h < R; h += 2)
                gemv_tile_q8x(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, r + h, p, dt, 2, 4);
            i += 4;
        } else if (left >= 2) {
            for (int h = 0; h < R; h += 4)
                gemv_tile_q8x(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, r + h, p, dt, 4, 2);
            i += 2;
        } else {
            gemv_tile_q8x(yi, ldy, qi, ldq, wr, rb, w, r, p, dt, 8, 1);
            i += 1;
        }
    }
}

#define GEMV_Q8_DEFINE(name, DT)                                                             \
    static void name(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,            \
                     const weight_t *w, int64_t r0, int64_t r1)                             \
    {                                                                                       \
        int64_t pf = (int64_t)GEMV_R * (int64_t)dtype_row_bytes(DT, w->cols);               \
        int64_t r = r0;                                                                     \
        for (; r + GEMV_R <= r1; r += GEMV_R)                                               \
            gemv_rows_q8(y, ldy, xq, ldq, n, w, r, r + 2 * GEMV_R <= r1 ? pf : 0, DT,       \
                         GEMV_R);                                                           \
        for (; r < r1; r++)                                                                 \
            gemv_rows_q8(y, ldy, xq, ldq, n, w, r, 0, DT, 1);                               \
    }

GEMV_Q8_DEFINE(gemv_q4_x8, DTYPE_Q4)

static void avx2_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                      int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    if (!cpu_weight_simd_ok(w)) {
        cpu_scalar_gemv(y, ldy, x, ldx, xq, ldq, n, w, r0, r1);
        return;
    }
    if (xq && w->dtype == DTYPE_Q4) {
        gemv_q4_x8(y, ldy, xq, ldq, n, w, r0, r1);
        return;
    }
    if (xq && w->dtype == DTYPE_Q4X8) {
        avx2_q4x8_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        return;
    }
    if (xq && w->dtype == DTYPE_Q8) {
        avx2_q8_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        return;
    }
    if (xq && w->dtype == DTYPE_Q8X8) {
        avx2_q8_x8_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        return;
    }
    switch (w->dtype) {
    case DTYPE_F32:
        gemv_f32(y, ldy, x, ldx, n, w, r0, r1);
        break;
    case DTYPE_F16:
    case DTYPE_F16X8: /* the layout is read off the weight (gemv_tile_any) */
        gemv_f16(y, ldy, x, ldx, n, w, r0, r1);
        break;
    case DTYPE_BF16:
    case DTYPE_BF16X8:
        gemv_bf16(y, ldy, x, ldx, n, w, r0, r1);
        break;
    case DTYPE_Q8:
        gemv_q8(y, ldy, x, ldx, n, w, r0, r1);
        break;
    case DTYPE_Q4:
        gemv_q4(y, ldy, x, ldx, n, w, r0, r1);
        break;
    default:
        break;
    }
}

static void avx2_rows_to_f32(float *dst, const weight_t *w, int64_t r0, int64_t r1)
{
    if (w->dtype == DTYPE_Q4X8) {
        avx2_q4x8_rows_to_f32(dst, w, r0, r1);
        return;
    }
    if (w->dtype == DTYPE_Q8X8) {
        avx2_q8_x8_rows_to_f32(dst, w, r0, r1);
        return;
    }
    if (!cpu_weight_simd_ok(w)) {
        cpu_scalar_rows_to_f32(dst, w, r0, r1);
        return;
    }
    dtype_t dt = w->dtype;
    int64_t cols = w->cols;
    size_t rb = dtype_row_bytes(dt, cols);
    if (cpu_rowblock_is(dt)) {
        /* Whole chunks of 32 columns (rowblock.h), four vectors each. */
        dtype_t et = cpu_rowblock_elem(dt);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = cpu_rowblock_at(w->data, rb, r, 0);
            float *d = dst + (r - r0) * cols;
            for (int64_t k = 0; k < cols; k += 32) {
                const uint8_t *c = row + (size_t)(k / 32) * CPU_ROWBLOCK_SPAN;
                for (int j = 0; j < 32; j += 8)
                    _mm256_storeu_ps(d + k + j, ld8(et, c, j));
            }
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        float *d = dst + (r - r0) * cols;
        if (dt == DTYPE_Q4 || dt == DTYPE_Q8) {
            int64_t ng = cols / w->group;
            for (int64_t g = 0; g < ng; g++) {
                __m256 s = _mm256_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
                __m256 z = _mm256_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
                for (int64_t k = g * w->group; k < (g + 1) * w->group; k += 8)
                    _mm256_storeu_ps(d + k, _mm256_mul_ps(_mm256_sub_ps(ld8_codes(dt, row, k), z), s));
            }
            continue;
        }
        if (dt == DTYPE_F32) {
            memcpy(d, row, (size_t)cols * sizeof(float));
            continue;
        }
        int64_t k = 0;
        if (dt == DTYPE_F16) {
            for (; k + 8 <= cols; k += 8)
                _mm256_storeu_ps(d + k, ld8(DTYPE_F16, row, k));
        } else {
            for (; k + 8 <= cols; k += 8)
                _mm256_storeu_ps(d + k, ld8(DTYPE_BF16, row, k));
        }
        for (; k < cols; k++)
            d[k] = ld1(dt, row, k);
    }
}

/* ---- prefill ---------------------------------------------------------------------------- */

static void avx2_gemm_pack(float *xp, const float *x, int64_t ldx, int m, int64_t cols)
{
    for (int64_t k0 = 0; k0 < cols; k0 += 16) {
        int64_t kn = cols - k0 < 16 ? cols - k0 : 16;
        for (int i = 0; i < m; i++) {
            const float *xi = x + i * ldx + k0;
            for (int64_t k = 0; k < kn; k++)
                xp[(k0 + k) * GEMM_P + i] = xi[k];
        }
        for (int i = m; i < GEMM_P; i++)
            for (int64_t k = 0; k < kn; k++)
                xp[(k0 + k) * GEMM_P + i] = 0.0f;
    }
}

AI void gemm_tile(float *y, int64_t ldy, const float *xp, int m, const float *wf, int64_t ldw,
                  int64_t cols, const int R)
{
    __m256 acc[GEMM_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm256_setzero_ps();
        acc[r][1] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < cols; k++) {
        __m256 x0 = _mm256_load_ps(xp + k * GEMM_P);
        __m256 x1 = _mm256_load_ps(xp + k * GEMM_P + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 b = _mm256_broadcast_ss(wf + r * ldw + k);
            acc[r][0] = _mm256_fmadd_ps(x0, b, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x1, b, acc[r][1]);
        }
    }
    _Alignas(32) float t[GEMM_R][GEMM_P];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_store_ps(t[r], acc[r][0]);
        _mm256_store_ps(t[r] + 8, acc[r][1]);
    }
    for (int i = 0; i < m; i++)
        for (int r = 0; r < R; r++)
            y[i * ldy + r] = t[r][i];
}

static void avx2_gemm_block(float *y, int64_t ldy, const float *xp, int m, const float *wf,
                            int64_t ldw, int64_t nr, int64_t cols)
{
    int64_t r = 0;
    for (; r + GEMM_R <= nr; r += GEMM_R)
        gemm_tile(y + r, ldy, xp, m, wf + r * ldw, ldw, cols, GEMM_R);
    for (; r + 2 <= nr; r += 2)
        gemm_tile(y + r, ldy, xp, m, wf + r * ldw, ldw, cols, 2);
    for (; r < nr; r++)
        gemm_tile(y + r, ldy, xp, m, wf + r * ldw, ldw, cols, 1);
}

/* ---- prefill of float weights in gemv's order (simd.h: gemm_wpack, gemm_dot) ---------- */

/* y[j] = hsum8(v[j]) for the j < nr of a tile row's 6 vectors of partial sums: hsum8x8 of
 * the six and two of zeros, hsum8's bits in half the instructions of six hsum8s. */
AI void avx2_sums_store(float *y, const __m256 *v, int nr)
{
    __m256 x[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        x[j] = j < 6 ? v[j] : _mm256_setzero_ps();
    __m256 s = hsum8x8(x);
    if (nr == 6) {
        _mm_storeu_ps(y, _mm256_castps256_ps128(s));
        _mm_storel_pi((__m64 *)(y + 4), _mm256_extractf128_ps(s, 1));
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, s);
    for (int j = 0; j < nr; j++)
        y[j] = t[j];
}

/* Tiles of 2 rows of x against 6 weight rows: 12 vectors of partial sums (12 chains of
 * multiply-adds, enough to keep both FMA units busy through their latency), the two x
 * vectors and one weight vector at a time, 15 of the 16 registers. Per step the tile loads
 * two vectors of x, which stream from L2, and six of the panel, which stays in L1; a 3 x 4
 * tile loads three of x for the same work. */
#define GD_FN(name) avx2_##name
#define GD_V __m256
#define GD_L 8
#define GD_MR 2
#define GD_NR 6
_Static_assert(GD_NR == 6, "avx2_sums_store ends rows of six vectors");
#define GD_ZERO() _mm256_setzero_ps()
#define GD_LOAD(p) _mm256_load_ps(p)
#define GD_LOADU(p) _mm256_loadu_ps(p)
#define GD_STORE(p, v) _mm256_store_ps(p, v)
#define GD_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define GD_SUMS(y, v, nr) avx2_sums_store(y, v, nr)
#define GD_LDW(et, p) ld8(et, p, 0)
#define GD_LDW_EO(p, s) ld8_eo(p, s)
#include "kernels/cpu/gemm_dot_x86.h"

/* ---- bf16 weights in even/odd order ----------------------------------------------------- */

/* Widening 8 bf16 weights to f32 in column order takes two instructions before their FMA
 * (vpmovzxwd, a shuffle, and vpslld), and in a decode step from memory that work ran
 * alongside the reads, not under them: one thread read a 512 x 2048 bf16 matrix from L3 at
 * 53 GB/s, 0.7 of what the AVX-512 levels read it at, and two threads from memory at
 * about 0.7 of the read sweep (river bench --kernels, Zen 5 VM, AVX2 forced). Loaded 16 at
 * a time, the 32-bit lanes hold column pairs: the lanes shifted left by 16 are the even
 * columns as f32, and the lanes with their low half cleared the odd ones, one instruction
 * for 8 weights. The same thread then read the matrix at 69-79 GB/s, and two threads from
 * memory 1.07x faster (median of three alternating rounds).
 *
 * So bf16 weights whose columns are whole blocks of 16 (cpu_kernels_for) take this
 * level's kernels in that order: within each block of 16 columns, the 8 even ones, then
 * the 8 odd ones, each output one vector of partial sums as before. x is put in that order
 * once per call (gemv_prep), the decode tiles below read it so, and the prefill path packs
 * the panels (gemm_wpack_eo) and reads x (gemm_x_cols_per_float) in the same order, so a
 * row has one set of bits whatever the batch, as for every float weight. */
#define EO_COLS 16

static int64_t eo_prep_floats(const weight_t *w)
{
    return w->cols;
}

/* Each block of 16 columns of x as its 8 even columns, then its 8 odd ones. */
static void eo_prep(float *xq, const float *x, int64_t ldx, int n, const weight_t *w)
{
    int64_t cols = w->cols;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * ldx;
        float *qi = xq + (int64_t)i * cols;
        for (int64_t k = 0; k < cols; k += EO_COLS) {
            __m256 a = _mm256_loadu_ps(xi + k), b = _mm256_loadu_ps(xi + k + 8);
            /* Within each 128-bit half: a0 a2 b0 b2 (even) and a1 a3 b1 b3 (odd); then the
             * 64-bit quarters in the order 0, 2, 1, 3. */
            __m256d e = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));
            __m256d o = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd));
            _mm256_storeu_ps(qi + k, _mm256_castpd_ps(_mm256_permute4x64_pd(e, 0xd8)));
            _mm256_storeu_ps(qi + k + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(o, 0xd8)));
        }
    }
}

/* R weight rows (rs bytes apart from w, their 64-byte chunks cs bytes apart: rowblock.h)
 * against N rows of x in even/odd order; pf > 0 prefetches the row-major rows pf bytes on.
 * Up to two rows of x are held in registers; four are read from L1 by each multiply-add,
 * leaving the 16 registers to 12 accumulators and a weight block. */
AI void eo_tile(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                size_t rs, size_t cs, int64_t cols, int64_t pf, const int R, const int N)
{
    __m256 acc[CPU_ROWBLOCK_ROWS][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < cols; k += EO_COLS) {
        const uint8_t *wk = w + col_off(k, cs, DTYPE_BF16);
        if (cs != CPU_ROWBLOCK_CHUNK) {
            if (k % (CPU_ROWBLOCK_CHUNK / 2) == 0)
                cpu_rowblock_prefetch(wk, R);
        } else if (pf) {
            gemv_prefetch(w, rs, k, pf, DTYPE_BF16, R);
        }
        __m256 xe[2], xo[2];
#pragma GCC unroll 2
        for (int i = 0; i < N && N <= 2; i++) {
            xe[i] = _mm256_loadu_ps(xq + i * ldq + k);
            xo[i] = _mm256_loadu_ps(xq + i * ldq + k + 8);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wk + r * rs));
            __m256 we = eo_even(v), wo = eo_odd(v);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                const float *xi = xq + i * ldq + k;
                acc[r][i] = _mm256_fmadd_ps(we, N <= 2 ? xe[i] : _mm256_loadu_ps(xi), acc[r][i]);
                acc[r][i] = _mm256_fmadd_ps(wo, N <= 2 ? xo[i] : _mm256_loadu_ps(xi + 8),
                                            acc[r][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum8(acc[r][i]);
}

/* R rows (a block of 8, or 1) from row r against all n rows of x: four at a time in tiles
 * of 3, 3 and 2 rows (12 accumulators, as gemv_rows), then two (4 x 2), then one (8 x 1).
 * The first pass prefetches. */
AI void eo_rows(float *y, int64_t ldy, const float *xq, int64_t ldq, int n, const weight_t *w,
                int64_t r, int64_t pf, const int R)
{
    size_t rb = dtype_row_bytes(w->dtype, w->cols);
    int blocked = cpu_rowblock_is(w->dtype);
    const uint8_t *b = blocked ? cpu_rowblock_at(w->data, rb, r, 0)
                               : (const uint8_t *)w->data + (size_t)r * rb;
    size_t rs = blocked ? CPU_ROWBLOCK_CHUNK : rb;
    size_t cs = blocked ? CPU_ROWBLOCK_SPAN : CPU_ROWBLOCK_CHUNK;
    int64_t cols = w->cols;
    for (int i = 0; i < n;) {
        float *yi = y + i * ldy + r;
        const float *xi = xq + i * ldq;
        int64_t p = i == 0 ? pf : 0;
        if (R == CPU_ROWBLOCK_ROWS && n - i >= 4) {
            eo_tile(yi, ldy, xi, ldq, b, rs, cs, cols, p, 3, 4);
            eo_tile(yi + 3, ldy, xi, ldq, b + 3 * rs, rs, cs, cols, p, 3, 4);
            eo_tile(yi + 6, ldy, xi, ldq, b + 6 * rs, rs, cs, cols, p, 2, 4);
            i += 4;
        } else if (R == CPU_ROWBLOCK_ROWS && n - i >= 2) {
            eo_tile(yi, ldy, xi, ldq, b, rs, cs, cols, p, 4, 2);
            eo_tile(yi + 4, ldy, xi, ldq, b + 4 * rs, rs, cs, cols, p, 4, 2);
            i += 2;
        } else if (R == CPU_ROWBLOCK_ROWS) {
            eo_tile(yi, ldy, xi, ldq, b, rs, cs, cols, p, CPU_ROWBLOCK_ROWS, 1);
            i += 1;
        } else {
            eo_tile(yi, ldy, xi, ldq, b, rs, cs, cols, 0, 1, 1);
            i += 1;
        }
    }
}

/* Reads x only as eo_prep leaves it: matmul.c prepares it for every call of this table. */
static void eo_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                    int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    (void)x;
    (void)ldx;
    int64_t pf = cpu_rowblock_is(w->dtype)
                     ? 0
                     : CPU_ROWBLOCK_ROWS * (int64_t)dtype_row_bytes(w->dtype, w->cols);
    int64_t r = r0;
    for (; r + CPU_ROWBLOCK_ROWS <= r1; r += CPU_ROWBLOCK_ROWS)
        eo_rows(y, ldy, xq, ldq, n, w, r, r + 2 * CPU_ROWBLOCK_ROWS <= r1 ? pf : 0,
                CPU_ROWBLOCK_ROWS);
    for (; r < r1; r++)
        eo_rows(y, ldy, xq, ldq, n, w, r, 0, 1);
}

/* ---- vector ops ------------------------------------------------------------------------- */

static float avx2_dot(const float *a, const float *b, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 16), _mm256_loadu_ps(b + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 24), _mm256_loadu_ps(b + k + 24), a3);
    }
    for (; k + 8 <= n; k += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), a0);
    if (k < n) {
        __m256i m = mask8(n - k);
        a1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + k, m), _mm256_maskload_ps(b + k, m), a1);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

static float avx2_sumsq(const float *x, int64_t n)
{
    return avx2_dot(x, x, n);
}

static void avx2_scale_mul(float *out, const float *x, float s, const float *w, int64_t n)
{
    __m256 sv = _mm256_set1_ps(s);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_loadu_ps(w + k),
                                                _mm256_mul_ps(sv, _mm256_loadu_ps(x + k))));
    if (k < n) {
        __m256i m = mask8(n - k);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(w + k, m),
                                 _mm256_mul_ps(sv, _mm256_maskload_ps(x + k, m)));
        _mm256_maskstore_ps(out + k, m, v);
    }
}

static void avx2_add(float *y, const float *x, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(y + k, _mm256_add_ps(_mm256_loadu_ps(y + k), _mm256_loadu_ps(x + k)));
    if (k < n) {
        __m256i m = mask8(n - k);
        _mm256_maskstore_ps(y + k, m, _mm256_add_ps(_mm256_maskload_ps(y + k, m),
                                                    _mm256_maskload_ps(x + k, m)));
    }
}

/* exp(x) to about 2 ulp: x = n ln2 + r, a degree-6 polynomial for e^r, and 2^n built in the
 * exponent field. x is clamped so that n stays within the normal exponents. */
AI __m256 exp8(__m256 x)
{
    /* Below ln(FLT_MIN) the result is exactly 0 rather than a subnormal; exp(-inf) too. */
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365478515625f), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)),
                      _mm256_set1_ps(-87.3365478515625f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

AI __m256 swiglu8(__m256 g, __m256 u)
{
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void avx2_swiglu(float *out, const float *g, const float *u, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, swiglu8(_mm256_loadu_ps(g + k), _mm256_loadu_ps(u + k)));
    if (k < n) {
        __m256i m = mask8(n - k);
        _mm256_maskstore_ps(out + k, m,
                            swiglu8(_mm256_maskload_ps(g + k, m), _mm256_maskload_ps(u + k, m)));
    }
}

static float avx2_exp_sum(float *x, int64_t n, float max)
{
    __m256 mv = _mm256_set1_ps(max);
    __m256 s = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + k), mv));
        _mm256_storeu_ps(x + k, e);
        s = _mm256_add_ps(s, e);
    }
    float sum = hsum8(s);
    for (; k < n; k++) {
        x[k] = expf(x[k] - max);
        sum += x[k];
    }
    return sum;
}

static float avx2_max(const float *x, int64_t n)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + k));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = _mm_cvtss_f32(h);
    for (; k < n; k++)
        m = x[k] > m ? x[k] : m;
    return m;
}

/* Rows ATTN_PF positions ahead are prefetched: their stride defeats the hardware. */
#define ATTN_PF 16

/* The sums of one query head against eight positions, hsum8x8 of their two chains each;
 * inlined with hd a constant for the usual head size of 64, whose query then stays in
 * registers across the eight. */
AI __m256 scores8(const float *qg, const float *const *rows, int64_t off, const int hd)
{
    __m256 x[8];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++) {
        const float *kt = rows[u] + off;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int j = 0; j < hd; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j), _mm256_loadu_ps(kt + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j + 8), _mm256_loadu_ps(kt + j + 8), a1);
        }
        x[u] = _mm256_add_ps(a0, a1);
    }
    return hsum8x8(x);
}

static void avx2_attn_scores(float *s, int64_t sstride, const float *q, int G, int hd,
                             const float *const *rows, int64_t off, int64_t T,
                        float scale)
{
    /* Eight positions at a time where all are there and the head is whole pairs of
     * vectors: the scores of a head and eight positions are summed across lanes together.
     * Each is the loop's below: the same two chains, the same sum. */
    int64_t t = 0;
    if (hd % 16 == 0)
        for (; t + 8 <= T; t += 8) {
            int full = 1;
            for (int u = 0; u < 8; u++)
                full &= rows[t + u] != NULL;
            if (!full)
                break;
            if (t + 8 + ATTN_PF <= T)
                for (int u = 0; u < 8; u++)
                    if (rows[t + ATTN_PF + u])
                        for (int j = 0; j < hd; j += 16)
                            _mm_prefetch((const char *)(rows[t + ATTN_PF + u] + off + j),
                                         _MM_HINT_T0);
            for (int g = 0; g < G; g++) {
                __m256 x = hd == 64 ? scores8(q + g * hd, rows + t, off, 64)
                                    : scores8(q + g * hd, rows + t, off, hd);
                _mm256_storeu_ps(s + g * sstride + t, _mm256_mul_ps(_mm256_set1_ps(scale), x));
            }
        }
    for (; t < T; t++) {
        const float *kt = rows[t] ? rows[t] + off : NULL;
        if (t + ATTN_PF < T && rows[t + ATTN_PF])
            for (int j = 0; j < hd; j += 16)
                _mm_prefetch((const char *)(rows[t + ATTN_PF] + off + j), _MM_HINT_T0);
        if (!kt) {
            for (int g = 0; g < G; g++)
                s[g * sstride + t] = -INFINITY;
            continue;
        }
        for (int g = 0; g < G; g++) {
            const float *qg = q + g * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            int j = 0;
            for (; j + 16 <= hd; j += 16) {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j), _mm256_loadu_ps(kt + j), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j + 8), _mm256_loadu_ps(kt + j + 8), a1);
            }
            for (; j + 8 <= hd; j += 8)
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + j), _mm256_loadu_ps(kt + j), a0);
            if (j < hd) {
                __m256i m = mask8(hd - j);
                a1 = _mm256_fmadd_ps(_mm256_maskload_ps(qg + j, m), _mm256_maskload_ps(kt + j, m), a1);
            }
            s[g * sstride + t] = scale * hsum8(_mm256_add_ps(a0, a1));
        }
    }
}

/* For each 8-wide slice of the head, up to four heads accumulate in registers over all
 * positions, each V slice loaded once for them. */
/* Two slices of the head against up to four heads: eight chains, each V load feeding four
 * of them. Each output is the chain over positions the one-slice loop below runs. */
AI void attn_values16(float *o, const float *p, int64_t pstride, int G, int hd,
                      const float *const *rows, int64_t off, int64_t T, int j)
{
    for (int g = 0; g < G; g += 4) {
        int gn = G - g < 4 ? G - g : 4;
        __m256 a[4][2];
        for (int h = 0; h < 4; h++) {
            a[h][0] = h < gn ? _mm256_loadu_ps(o + (g + h) * hd + j) : _mm256_setzero_ps();
            a[h][1] = h < gn ? _mm256_loadu_ps(o + (g + h) * hd + j + 8) : _mm256_setzero_ps();
        }
        for (int64_t t = 0; t < T; t++) {
            if (j == 0 && g == 0 && t + ATTN_PF < T && rows[t + ATTN_PF])
                for (int jj = 0; jj < hd; jj += 16)
                    _mm_prefetch((const char *)(rows[t + ATTN_PF] + off + jj), _MM_HINT_T0);
            if (!rows[t])
                continue;
            __m256 v0 = _mm256_loadu_ps(rows[t] + off + j);
            __m256 v1 = _mm256_loadu_ps(rows[t] + off + j + 8);
            if (gn == 4) {
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    __m256 b = _mm256_broadcast_ss(p + (g + h) * pstride + t);
                    a[h][0] = _mm256_fmadd_ps(b, v0, a[h][0]);
                    a[h][1] = _mm256_fmadd_ps(b, v1, a[h][1]);
                }
            } else {
                for (int h = 0; h < gn; h++) {
                    __m256 b = _mm256_broadcast_ss(p + (g + h) * pstride + t);
                    a[h][0] = _mm256_fmadd_ps(b, v0, a[h][0]);
                    a[h][1] = _mm256_fmadd_ps(b, v1, a[h][1]);
                }
            }
        }
        for (int h = 0; h < gn; h++) {
            _mm256_storeu_ps(o + (g + h) * hd + j, a[h][0]);
            _mm256_storeu_ps(o + (g + h) * hd + j + 8, a[h][1]);
        }
    }
}

static void avx2_attn_values(float *o, const float *p, int64_t pstride, int G, int hd,
                             const float *const *rows, int64_t off, int64_t T)
{
    int j0 = 0;
    for (; j0 + 16 <= hd; j0 += 16)
        attn_values16(o, p, pstride, G, hd, rows, off, T, j0);
    for (int j = j0; j < hd; j += 8) {
        __m256i m = mask8(hd - j >= 8 ? 8 : hd - j);
        for (int g = 0; g < G; g += 4) {
            int gn = G - g < 4 ? G - g : 4;
            __m256 a[4];
            for (int h = 0; h < 4; h++)
                a[h] = h < gn ? _mm256_maskload_ps(o + (g + h) * hd + j, m) : _mm256_setzero_ps();
            for (int64_t t = 0; t < T; t++) {
                if (j == 0 && g == 0 && t + ATTN_PF < T && rows[t + ATTN_PF])
                    for (int jj = 0; jj < hd; jj += 16)
                        _mm_prefetch((const char *)(rows[t + ATTN_PF] + off + jj), _MM_HINT_T0);
                if (!rows[t])
                    continue;
                __m256 vv = _mm256_maskload_ps(rows[t] + off + j, m);
                for (int h = 0; h < gn; h++)
                    a[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (g + h) * pstride + t), vv, a[h]);
            }
            for (int h = 0; h < gn; h++)
                _mm256_maskstore_ps(o + (g + h) * hd + j, m, a[h]);
        }
    }
}

/* Six query vectors (any rows and heads) against two slices of the head: the prefill
 * GEMM's 6 x 16 register tile, with the positions as its columns. */
AI void attn_values_tile(float *const *op, const float *const *pp, const float *const *rows,
                         int64_t off, int64_t T, int j, const int R)
{
    __m256 a[6][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        a[r][0] = _mm256_loadu_ps(op[r] + j);
        a[r][1] = _mm256_loadu_ps(op[r] + j + 8);
    }
    for (int64_t t = 0; t < T; t++) {
        if (!rows[t])
            continue;
        __m256 v0 = _mm256_loadu_ps(rows[t] + off + j);
        __m256 v1 = _mm256_loadu_ps(rows[t] + off + j + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 b = _mm256_broadcast_ss(pp[r] + t);
            a[r][0] = _mm256_fmadd_ps(b, v0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(b, v1, a[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(op[r] + j, a[r][0]);
        _mm256_storeu_ps(op[r] + j + 8, a[r][1]);
    }
}

static void avx2_attn_values_rows(float *o, int64_t ostride, const float *p, int64_t pstride,
                                  int m, int G, int hd, const float *const *rows, int64_t off,
                                  int64_t T)
{
    if (hd % 16 != 0) {
        for (int i = 0; i < m; i++)
            avx2_attn_values(o + i * ostride, p + (int64_t)i * G * pstride, pstride, G, hd,
                             rows, off, T);
        return;
    }
    int nq = m * G;
    for (int q0 = 0; q0 < nq; q0 += 6) {
        int R = nq - q0 < 6 ? nq - q0 : 6;
        float *op[6];
        const float *pp[6];
        for (int r = 0; r < R; r++) {
            int q = q0 + r;
            op[r] = o + (q / G) * ostride + (q % G) * hd;
            pp[r] = p + (int64_t)q * pstride;
        }
        for (int j = 0; j < hd; j += 16) {
            switch (R) {
            case 6: attn_values_tile(op, pp, rows, off, T, j, 6); break;
            case 5: attn_values_tile(op, pp, rows, off, T, j, 5); break;
            case 4: attn_values_tile(op, pp, rows, off, T, j, 4); break;
            case 3: attn_values_tile(op, pp, rows, off, T, j, 3); break;
            case 2: attn_values_tile(op, pp, rows, off, T, j, 2); break;
            default: attn_values_tile(op, pp, rows, off, T, j, 1); break;
            }
        }
    }
}

/* Eight elements at a time; widening is exact, so the floats are kv_row_to_f32's. */
static void avx2_kv_to_f32(float *dst, dtype_t dt, const void *base, const float *scales,
                           int64_t off, int64_t n)
{
    int64_t j = 0;
    if (dt == DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)base + off;
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))));
    } else if (dt == DTYPE_BF16) {
        const uint16_t *h = (const uint16_t *)base + off;
        for (; j + 8 <= n; j += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + j)));
            _mm256_storeu_ps(dst + j, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    } else if (dt == DTYPE_Q8) {
        const int8_t *c = (const int8_t *)base + off;
        for (; j + 8 <= n; j += 8) {
            __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + j)));
            __m256 sc = _mm256_set1_ps(scales[(off + j) / KV_Q8_BLOCK]);
            _mm256_storeu_ps(dst + j, _mm256_mul_ps(_mm256_cvtepi32_ps(w), sc));
        }
    }
    if (j < n)
        kv_row_to_f32(dt, base, scales, off + j, dst + j, n - j);
}

static uint64_t avx2_read_sum(const void *buf, size_t bytes)
{
    const __m256i *p = buf;
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    __m256i a2 = _mm256_setzero_si256(), a3 = _mm256_setzero_si256();
    for (size_t i = 0; i < bytes / 32; i += 4) {
        cpu_prefetch_page_ahead((uintptr_t)(p + i)); /* as the decode tiles (prefetch.h) */
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + i + 3));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

/* ---- compute peak ------------------------------------------------------------------------ */

PEAK_FN static float avx2_peak_f32(int64_t iters)
{
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
#define INIT(i) _mm256_set1_ps((float)(i))
#define STEP(a) _mm256_fmadd_ps(a, m, c)
    return hsum8(PEAK_ROUNDS(__m256, iters, INIT, STEP, _mm256_add_ps));
#undef INIT
#undef STEP
}

/* The fields the two tables of this file share. */
#define AVX2_COMMON_FIELDS \
    .level = CPU_SIMD_AVX2, \
    .q4x8 = 1, \
    .q8x8 = 1, \
    .rowblock = 1, \
    .gemv_x8_block = avx2_gemv_x8_block, \
    .gemm_panel = GEMM_P, \
    .gemm_pack = avx2_gemm_pack, \
    .gemm_block = avx2_gemm_block, \
    .gemm_mr = GD_MR, \
    .gemm_nr = GD_NR, \
    .gemm_lanes = GD_L, \
    .gemm_dot = avx2_gemm_dot, \
    .rows_to_f32 = avx2_rows_to_f32, \
    .dot = avx2_dot, \
    .sumsq = avx2_sumsq, \
    .scale_mul = avx2_scale_mul, \
    .add = avx2_add, \
    .swiglu = avx2_swiglu, \
    .attn_scores = avx2_attn_scores, \
    .attn_values = avx2_attn_values, \
    .attn_values_rows = avx2_attn_values_rows, \
    .kv_to_f32 = avx2_kv_to_f32, \
    .kv_from_f32 = x86_kv_from_f32, \
    .exp_sum = avx2_exp_sum, \
    .max = avx2_max, \
    .read_sum = avx2_read_sum, \
    .peak_f32 = avx2_peak_f32, \
    .peak_i8 = x86_peak_maddubs, \
    .peak_q8_tile = x86_peak_q8_tile_maddubs, \
    .peak_macs_f32 = PEAK_CHAINS * 8, \
    .peak_macs_i8 = PEAK_CHAINS * 32, \
    .peak_macs_q8_tile = X86_Q8_TILE_MACS,

const cpu_kernels_t cpu_kernels_avx2 = {
    AVX2_COMMON_FIELDS
    .gemv = avx2_gemv,
    .gemv_prep_floats = avx2_gemv_prep_floats,
    .gemv_prep = avx2_gemv_prep,
    .gemm_wpack = avx2_gemm_wpack,
};

/* bf16 weights of whole blocks of 16 columns (cpu_kernels_for): the even/odd order, x
 * prepared in it for decode and prefill alike. */
const cpu_kernels_t cpu_kernels_avx2_bf16 = {
    AVX2_COMMON_FIELDS
    .gemv = eo_gemv,
    .gemv_prep_floats = eo_prep_floats,
    .gemv_prep = eo_prep,
    .gemm_x_cols_per_float = 1,
    .gemm_wpack = avx2_gemm_wpack_eo,
};
