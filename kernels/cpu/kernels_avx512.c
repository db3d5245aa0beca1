/* The AVX-512 kernels (F/BW/VL/DQ). Compiled with AVX-512 flags and only ever called after
 * cpu_simd_detect() found those extensions.
 *
 * The register tiles are written as small fixed-size arrays indexed by loop counters that
 * are compile-time constants after inlining; `#pragma GCC unroll` turns them into plain
 * registers (no stack traffic in the inner loops). */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels/cpu/q4x8.h"
#include "kernels/cpu/rowblock.h"
#include "kernels/cpu/peak_rounds.h"
#include "kernels/cpu/simd.h"
#include "kernels/half.h"
#include "kernels/kv_row.h"

#define AI static inline __attribute__((always_inline))

#include "kernels/cpu/x86_util.h"

/* Decode: weight rows per block (the rows streamed at once), and the most x rows one
 * register tile applies them to. A tile holds R x N accumulators: 8 x 2 or 4 x 4. More x
 * rows per tile would convert each weight vector fewer times, but their x slices would no
 * longer fit in L1 with the weights (measured: 8 x rows of 2048 columns ran at half the
 * speed of two passes of 4). */
#define GEMV_R 8
#define GEMV_N 4
#define GEMV_NQ 4 /* Q4/Q8 */
/* Software prefetch of the next block of rows, at the same column, into L1: together with
 * eight concurrent row streams it keeps enough lines in flight to approach the bandwidth of
 * a plain sweep (measured: about 0.8 without it, 0.9 and more with it). */
#define GEMV_PF_HINT _MM_HINT_T0
/* GEMM tile: rows of f32 weights against one 32-row panel of x (two vectors). */
#define GEMM_P 32
#define GEMM_R 12

/* ---- sums of the lanes ---------------------------------------------------------------- */

/* The sum of the 16 lanes, in the order GCC's _mm512_reduce_add_ps adds them (the halves,
 * then quarters, then lanes two apart, then neighbours), written out so that every output
 * of a float matmul gets these bits whichever compiler builds it: the prefill GEMM's sums of
 * many vectors at once (hsum16x16) take the same pairs. */
AI float hsum16(__m512 v)
{
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* hsum16 of sixteen vectors at once: lane u of the result is hsum16(x[u]) bit for bit,
 * each step adding the pairs hsum16 adds, of all sixteen, in 15 additions, 30 shuffles
 * within or across 128-bit lanes and one permutation instead of 16 x 4 additions and 16 x 4
 * shuffles. Inlined with some of x constant zeros, their work folds away. (reduce16, the
 * attention kernels' tree, adds neighbouring lanes first: other bits than decode's.) */
AI __m512 hsum16x16(const __m512 x[16])
{
    __m512 h[8], q[4], p[2];
    /* h[i]: lanes 0-7 the halves of x[2i] added, lanes 8-15 those of x[2i + 1]. */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xee));
    /* q[i]: 128-bit lane m the quarters of x[4i + m] added. */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xdd));
    /* p[i]: 128-bit lane m lanes two apart added, of x[8i + m] then of x[8i + 4 + m]. */
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        p[i] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0xee));
    /* Lane 4m + j: the sum of x[m + 4j]. */
    __m512 r =
        _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], 0x88), _mm512_shuffle_ps(p[0], p[1], 0xdd));
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* y[j] = hsum16(v[j]) for the j < nr of n (a constant, at most 16) vectors of partial sums:
 * the prefill GEMM's ending of a tile row, hsum16x16 with the vectors past n zeros. */
AI void avx512_sums_store(float *y, const __m512 *v, const int n, int nr)
{
    __m512 x[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        x[j] = j < n ? v[j] : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), hsum16x16(x));
}

/* ---- loading 16 weights as f32 ---------------------------------------------------------- */

AI __m512 ld16(dtype_t dt, const uint8_t *row, int64_t k)
{
    switch (dt) {
    case DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k)));
    case DTYPE_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default:
        return _mm512_loadu_ps((const float *)row + k);
    }
}

/* Vector s of bf16 weights in even/odd order (the section "bf16 weights in even/odd order"
 * says why), counted from a block of 32 columns; p is where vector s of the plain order
 * starts. */
AI __m512 ld16_eo(const uint8_t *p, int64_t s)
{
    __m512i v = _mm512_loadu_si512(p - (s & 1) * 32);
    return _mm512_castsi512_ps((s & 1) ? _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))
                                       : _mm512_slli_epi32(v, 16));
}

AI __m512 ld16_mask(dtype_t dt, const uint8_t *row, int64_t k, __mmask16 m)
{
    switch (dt) {
    case DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
    case DTYPE_BF16: {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    }
}

/* 16 codes of a Q4/Q8 row starting at column k (a multiple of 16), as f32. */
AI __m512 ld16_codes(dtype_t dt, const uint8_t *row, int64_t k)
{
    __m128i c;
    if (dt == DTYPE_Q8) {
        c = _mm_loadu_si128((const __m128i *)(row + k));
    } else {
        /* Eight bytes hold the 16 codes, even columns in the low nibbles: split the nibbles
         * and interleave them back into column order. */
        __m128i b = _mm_loadl_epi64((const __m128i *)(row + k / 2));
        __m128i mask = _mm_set1_epi8(0x0f);
        __m128i lo = _mm_and_si128(b, mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
        c = _mm_unpacklo_epi8(lo, hi);
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c));
}

AI __mmask16 tail_mask(int64_t left)
{
    return (__mmask16)((1u << left) - 1u);
}

/* ---- decode: weights read in place ------------------------------------------------------ */

/* Bytes of one weight element, halved for Q4 (whose codes are half a byte). */
AI int elem_bytes_x2(dtype_t dt)
{
    switch (dt) {
    case DTYPE_F32:
        return 8;
    case DTYPE_F16:
    case DTYPE_BF16:
        return 4;
    case DTYPE_Q8:
        return 2;
    default:
        return 1;
    }
}

/* Prefetches the 64-byte lines that R rows will need `pf` bytes ahead of column k, once per
 * line: called every 16 columns, it issues when those columns begin a new line. */
AI void gemv_prefetch(const uint8_t *w, size_t rb, int64_t k, int64_t pf, const dtype_t dt,
                      const int R)
{
    int64_t byte = k * elem_bytes_x2(dt) / 2; /* offset of column k in a row */
    int64_t step = 16 * elem_bytes_x2(dt) / 2; /* bytes of 16 columns */
    if (step < 64 && (byte & 63) >= step)
        return;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const char *p = (const char *)(w + r * rb + byte + pf);
        _mm_prefetch(p, GEMV_PF_HINT);
        if (step > 64)
            _mm_prefetch(p + 64, GEMV_PF_HINT);
    }
}

/* Byte offset of column k (a multiple of 16) in a row whose 64-byte chunks are cs bytes
 * apart (rowblock.h: 64 in the row-major layout, which makes it k's plain offset). */
AI size_t col_off(int64_t k, size_t cs, const dtype_t dt)
{
    int64_t es = elem_bytes_x2(dt) / 2, per = CPU_ROWBLOCK_CHUNK / es;
    return (size_t)(k / per) * cs + (size_t)(k % per * es);
}

/* R weight rows (rb bytes apart, starting at w, their 64-byte chunks cs bytes apart: see
 * rowblock.h) against N rows of x; pf > 0 prefetches the rows pf bytes further on (the
 * row-major layout only). */
AI void gemv_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const uint8_t *w,
                  size_t rb, size_t cs, int64_t cols, int64_t pf, const dtype_t dt,
                  const int R, const int N)
{
    __m512 acc[GEMV_R][GEMV_N];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= cols; k += 16) {
        if (pf)
            gemv_prefetch(w, rb, k, pf, dt, R);
        __m512 xv[GEMV_N];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            xv[i] = _mm512_loadu_ps(x + i * ldx + k);
        const uint8_t *wk = w + col_off(k, cs, dt);
        if (cs != CPU_ROWBLOCK_CHUNK && col_off(k, CPU_ROWBLOCK_CHUNK, dt) % CPU_ROWBLOCK_CHUNK == 0)
            cpu_rowblock_prefetch(wk, R); /* row-blocked: at each chunk's start */
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = ld16(dt, wk + r * rb, 0);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
    if (k < cols) {
        __mmask16 m = tail_mask(cols - k);
        __m512 xv[GEMV_N];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            xv[i] = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = ld16_mask(dt, w + r * rb, k, m);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum16(acc[r][i]);
}

/* The same for Q4/Q8 (rows r0.. of wt): each group's codes are dequantised in registers as
 * (q - zero) * scale, then used like any other weight vector. */
AI void gemv_tile_q(float *y, int64_t ldy, const float *x, int64_t ldx, const uint8_t *w,
                    size_t rb, const weight_t *wt, int64_t r0, int64_t pf, const dtype_t dt,
                    const int R, const int N)
{
    int64_t cols = wt->cols;
    int group = wt->group;
    int64_t ng = cols / group;
    __m512 acc[GEMV_R][GEMV_NQ];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512 sc[GEMV_R], ze[GEMV_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            sc[r] = _mm512_set1_ps(_cvtsh_ss(wt->scales[(r0 + r) * ng + g]));
            ze[r] = _mm512_set1_ps(_cvtsh_ss(wt->zeros[(r0 + r) * ng + g]));
        }
        for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
            if (pf)
                gemv_prefetch(w, rb, k, pf, dt, R);
            __m512 xv[GEMV_NQ];
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                xv[i] = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 q = ld16_codes(dt, w + r * rb, k);
                __m512 wv = _mm512_mul_ps(_mm512_sub_ps(q, ze[r]), sc[r]);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++)
                    acc[r][i] = _mm512_fmadd_ps(wv, xv[i], acc[r][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum16(acc[r][i]);
}

/* Q4/Q8 factored by group: sum_k (q_k - z) s x_k = s sum_k q_k x_k - s z sum_k x_k. The
 * codes only need converting to f32 (no per-element dequantisation); each group's code dot
 * products gather in tmp and join acc scaled by the group's scale, and the zero terms are
 * subtracted sixteen groups at a time with the group sums of x, lane by lane (acc is
 * reduced across lanes at the end anyway). xq is x as gemv_prep leaves it: for Q4, each
 * block of 32 columns holds the 16 even columns and then the 16 odd ones, which is the order
 * in which the nibbles come out of the bytes; after the cols values come the group sums. */
AI void gemv_tile_qf(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                     size_t rb, const weight_t *wt, int64_t r0, int64_t pf, const dtype_t dt,
                     const int R, const int N)
{
    int64_t cols = wt->cols;
    int group = wt->group;
    int64_t ng = cols / group;
    const int step = dt == DTYPE_Q4 ? 32 : 16;
    __m512 acc[GEMV_R][GEMV_NQ];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t gb = 0; gb < ng; gb += 16) {
        __mmask16 mb = ng - gb >= 16 ? (__mmask16)0xffff : tail_mask(ng - gb);
        _Alignas(64) float sc[GEMV_R][16];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const uint16_t *sp = wt->scales + (r0 + r) * ng + gb;
            const uint16_t *zp = wt->zeros + (r0 + r) * ng + gb;
            __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mb, sp));
            __m512 sz = _mm512_mul_ps(s, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mb, zp)));
            _mm512_store_ps(sc[r], s);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm512_fnmadd_ps(sz, _mm512_loadu_ps(xq + i * ldq + cols + gb),
                                             acc[r][i]);
        }
        int64_t gend = gb + 16 < ng ? gb + 16 : ng;
        for (int64_t g = gb; g < gend; g++) {
            __m512 tmp[GEMV_R][GEMV_NQ];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int i = 0; i < N; i++)
                    tmp[r][i] = _mm512_setzero_ps();
            for (int64_t k = g * group; k < (g + 1) * group; k += step) {
                if (pf)
                    gemv_prefetch(w, rb, k, pf, dt, R);
                if (dt == DTYPE_Q4) {
                    __m512 xe[GEMV_NQ], xo[GEMV_NQ];
#pragma GCC unroll 4
                    for (int i = 0; i < N; i++) {
                        xe[i] = _mm512_loadu_ps(xq + i * ldq + k);
                        xo[i] = _mm512_loadu_ps(xq + i * ldq + k + 16);
                    }
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        /* One byte per lane: the low nibble is the even column, the high
                         * nibble (the byte shifted down, nothing above it) the odd one. */
                        __m512i b = _mm512_cvtepu8_epi32(
                            _mm_loadu_si128((const __m128i *)(w + r * rb + k / 2)));
                        __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
                        __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
#pragma GCC unroll 4
                        for (int i = 0; i < N; i++) {
                            tmp[r][i] = _mm512_fmadd_ps(lo, xe[i], tmp[r][i]);
                            tmp[r][i] = _mm512_fmadd_ps(hi, xo[i], tmp[r][i]);
                        }
                    }
                } else {
                    __m512 xv[GEMV_NQ];
#pragma GCC unroll 4
                    for (int i = 0; i < N; i++)
                        xv[i] = _mm512_loadu_ps(xq + i * ldq + k);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                            _mm_loadu_si128((const __m128i *)(w + r * rb + k))));
#pragma GCC unroll 4
                        for (int i = 0; i < N; i++)
                            tmp[r][i] = _mm512_fmadd_ps(q, xv[i], tmp[r][i]);
                    }
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 sg = _mm512_set1_ps(sc[r][g - gb]);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++)
                    acc[r][i] = _mm512_fmadd_ps(sg, tmp[r][i], acc[r][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum16(acc[r][i]);
}

/* Whether a Q4/Q8 weight takes the factored path (its groups hold whole vectors, and for
 * Q4 whole blocks of 32 columns). */
static int q_factored(const weight_t *w)
{
    return (w->dtype == DTYPE_Q8 && w->group % 16 == 0) ||
           (w->dtype == DTYPE_Q4 && w->group % 32 == 0);
}

/* ---- Q4X8: 256-bit integer kernels, with vpdpbusd where the processor has AVX-512 VNNI --- */

/* Eight fp16 values from p, the ones past `left` read as 0. */
AI __m256 ld8_f16_tail(const uint16_t *p, int64_t left)
{
    __mmask8 m = left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1);
    return _mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, p));
}

#define Q4X8_FN(name) avx512_q4x8_##name
#define Q4X8_VNNI 0
#include "kernels/cpu/q4x8_x86.h"
#undef Q4X8_FN
#undef Q4X8_VNNI
#define Q4X8_FN(name) avx512_q4x8v_##name
#define Q4X8_VNNI 1
#define Q4X8_ZMM 1
#include "kernels/cpu/q4x8_x86.h"
#undef Q4X8_FN
#undef Q4X8_VNNI
#undef Q4X8_ZMM

/* Q8 of whole 32-column blocks: the integer kernel of q8_x86.h (8-bit x, as the AVX2 level
 * and llama.cpp's q8_0 take it), with vpdpbusd where the processor has VNNI. It replaces
 * the factored f32 path for those weights: at 2 threads from memory that path converts
 * every code to f32 and is bound by the conversions from two rows of x on. */
#define Q8_FN(name) avx512_q8_##name
#define Q8_VNNI 0
#define Q8_Q4X8(name) avx512_q4x8_##name
#include "kernels/cpu/q8_x86.h"
#undef Q8_FN
#undef Q8_VNNI
#undef Q8_Q4X8
#define Q8_FN(name) avx512_q8v_##name
#define Q8_VNNI 1
#define Q8_ZMM 1
#define Q8_Q4X8(name) avx512_q4x8v_##name
#include "kernels/cpu/q8_x86.h"
#undef Q8_FN
#undef Q8_VNNI
#undef Q8_ZMM
#undef Q8_Q4X8

/* Whether vpdpbusd may run: read once (the answer does not change), under pthread_once,
 * since the first matmul of a process asks on every thread at once. A plain flag set after
 * the answer let a thread see the flag before the answer and run the other kernel on its
 * rows (whose bits differ by rounding): test_backend_ops caught it on the first call of a
 * case, the first row of the second thread's part. */
static int vnni_has;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;

static void vnni_init(void)
{
    __builtin_cpu_init();
    vnni_has = __builtin_cpu_supports("avx512vnni");
}

static int avx512_has_vnni(void)
{
    /* pthread_once fails only on misuse; the answer is then found by this thread. */
    if (pthread_once(&vnni_once, vnni_init) != 0)
        vnni_init();
    return vnni_has;
}

static int64_t avx512_gemv_prep_floats(const weight_t *w)
{
    if (w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8)
        return avx512_q4x8_prep_floats(w);
    if (cpu_q8_int_eligible(w))
        return avx512_q8_prep_floats(w);
    if (!q_factored(w))
        return 0;
    int64_t ng = w->cols / w->group;
    return w->cols + (ng + 15) / 16 * 16;
}

/* Q4 outside Q4X8 reads x in f32 at this level (gemv_tile_qf). */
static int avx512_gemv_x8_block(const weight_t *w)
{
    return w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8 || cpu_q8_int_eligible(w) ? 32 : 0;
}

static void avx512_gemv_prep(float *xq, const float *x, int64_t ldx, int n, const weight_t *w)
{
    if (w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8) {
        /* The same x8 either way; the folded zero sums (q4x8_x86.h, zfold) are the ones
         * the kernels that will read them want. */
        if (avx512_has_vnni())
            avx512_q4x8v_prep(xq, x, ldx, n, w);
        else
            avx512_q4x8_prep(xq, x, ldx, n, w);
        return;
    }
    if (cpu_q8_int_eligible(w)) {
        avx512_q8_prep(xq, x, ldx, n, w);
        return;
    }
    int64_t ldq = avx512_gemv_prep_floats(w), cols = w->cols;
    int64_t ng = cols / w->group;
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * ldx;
        float *qi = xq + i * ldq;
        if (w->dtype == DTYPE_Q4) {
            for (int64_t b = 0; b < cols; b += 32)
                for (int j = 0; j < 16; j++) {
                    qi[b + j] = xi[b + 2 * j];
                    qi[b + 16 + j] = xi[b + 2 * j + 1];
                }
        } else {
            memcpy(qi, xi, (size_t)cols * sizeof(float));
        }
        float *xs = qi + cols;
        for (int64_t g = 0; g < ng; g++) {
            float sum = 0.0f;
            for (int64_t k = g * w->group; k < (g + 1) * w->group; k++)
                sum += xi[k];
            xs[g] = sum;
        }
        for (int64_t g = ng; g < ldq - cols; g++)
            xs[g] = 0.0f;
    }
}

/* One tile of R rows starting at row r against the N rows of x from row i. */
AI void gemv_tile_any(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                      int64_t ldq, const weight_t *w, size_t rb, int64_t r, int i, int64_t pf,
                      const dtype_t dt, const int R, const int N)
{
    if (cpu_rowblock_is(w->dtype)) {
        gemv_tile(y + i * ldy + r, ldy, x + i * ldx, ldx, cpu_rowblock_at(w->data, rb, r, 0),
                  CPU_ROWBLOCK_CHUNK, CPU_ROWBLOCK_SPAN, w->cols, 0, dt, R, N);
        return;
    }
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;
    if (xq)
        gemv_tile_qf(y + i * ldy + r, ldy, xq + i * ldq, ldq, wr, rb, w, r, pf, dt, R, N);
    else if (dt == DTYPE_Q4 || dt == DTYPE_Q8)
        gemv_tile_q(y + i * ldy + r, ldy, x + i * ldx, ldx, wr, rb, w, r, pf, dt, R, N);
    else
        gemv_tile(y + i * ldy + r, ldy, x + i * ldx, ldx, wr, rb, CPU_ROWBLOCK_CHUNK, w->cols,
                  pf, dt, R, N);
}

/* Applies one block of R rows to all n rows of x, up to GEMV_N at a time: the block stays
 * in L1/L2 between the passes, so memory sees each weight byte once. The first pass
 * prefetches the next block. A tile gets at most 16 accumulators, the block being cut into
 * sub-blocks of 8, 4, 2 or 1 rows to fit. Q4/Q8 tiles keep as many registers again for
 * the group sums and x, so they take at most 8 accumulators. */
#define GEMV_SUB(NN)                                                                         \
    do {                                                                                     \
        if (R >= 8 && 8 * (NN) <= max_acc) {                                                 \
            gemv_tile_any(y, ldy, x, ldx, xq, ldq, w, rb, r, i, p, dt, 8, NN);               \
        } else if (R >= 4 && 4 * (NN) <= max_acc) {                                          \
            for (int h = 0; h < R; h += 4)                                                   \
                gemv_tile_any(y, ldy, x, ldx, xq, ldq, w, rb, r + h, i, p, dt, 4, NN);       \
        } else if (R >= 2 && 2 * (NN) <= max_acc) {                                          \
            for (int h = 0; h < R; h += 2)                                                   \
                gemv_tile_any(y, ldy, x, ldx, xq, ldq, w, rb, r + h, i, p, dt, 2, NN);       \
        } else {                                                                             \
            for (int h = 0; h < R; h++)                                                      \
                gemv_tile_any(y, ldy, x, ldx, xq, ldq, w, rb, r + h, i, p, dt, 1, NN);       \
        }                                                                                    \
    } while (0)

AI void gemv_rows(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                  int64_t ldq, int n, const weight_t *w, int64_t r, int64_t pf,
                  const dtype_t dt, const int R)
{
    size_t rb = dtype_row_bytes(dt, w->cols);
    const int max_acc = dt == DTYPE_Q4 || dt == DTYPE_Q8 ? 8 : 16;
    /* Row-blocked weights: whole blocks of 8 rows, 8 x 2 tiles (16 accumulators), so that
     * every pass reads its block as one stream (measured against 4 x 4 tiles at 2 and 4
     * rows of x: 0.94 and 0.89 of the read sweep against 0.82 and 0.70). */
    if (R == GEMV_R && cpu_rowblock_is(w->dtype)) {
        for (int i = 0; i < n;) {
            if (n - i >= 2) {
                gemv_tile_any(y, ldy, x, ldx, xq, ldq, w, rb, r, i, 0, dt, 8, 2);
                i += 2;
            } else {
                gemv_tile_any(y, ldy, x, ldx, xq, ldq, w, rb, r, i, 0, dt, 8, 1);
                i += 1;
            }
        }
        return;
    }
    for (int i = 0; i < n;) {
        int64_t p = i == 0 ? pf : 0;
        int left = n - i;
        if (left >= 4) {
            GEMV_SUB(4);
            i += 4;
        } else if (left == 3) {
            GEMV_SUB(3);
            i += 3;
        } else if (left == 2) {
            GEMV_SUB(2);
            i += 2;
        } else {
            GEMV_SUB(1);
            i += 1;
        }
    }
}

#define GEMV_DEFINE(name, DT)                                                                \
    static void name(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,   \
                     int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)         \
    {                                                                                       \
        int64_t pf = (int64_t)GEMV_R * (int64_t)dtype_row_bytes(DT, w->cols);               \
        int64_t r = r0;                                                                     \
        for (; r + GEMV_R <= r1; r += GEMV_R)                                               \
            gemv_rows(y, ldy, x, ldx, xq, ldq, n, w, r, r + 2 * GEMV_R <= r1 ? pf : 0, DT,  \
                      GEMV_R);                                                              \
        for (; r < r1; r++)                                                                 \
            gemv_rows(y, ldy, x, ldx, xq, ldq, n, w, r, 0, DT, 1);                          \
    }

GEMV_DEFINE(gemv_f32, DTYPE_F32)
GEMV_DEFINE(gemv_f16, DTYPE_F16)
GEMV_DEFINE(gemv_bf16, DTYPE_BF16)
GEMV_DEFINE(gemv_q8, DTYPE_Q8)
GEMV_DEFINE(gemv_q4, DTYPE_Q4)

static void avx512_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                        int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    if (!cpu_weight_simd_ok(w)) {
        cpu_scalar_gemv(y, ldy, x, ldx, xq, ldq, n, w, r0, r1);
        return;
    }
    if (w->dtype == DTYPE_Q4X8) {
        if (!xq)
            cpu_scalar_gemv(y, ldy, x, ldx, xq, ldq, n, w, r0, r1);
        else if (avx512_has_vnni())
            avx512_q4x8v_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        else
            avx512_q4x8_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        return;
    }
    if (w->dtype == DTYPE_Q8X8) {
        if (!xq)
            cpu_scalar_gemv(y, ldy, x, ldx, xq, ldq, n, w, r0, r1);
        else if (avx512_has_vnni())
            avx512_q8v_x8_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        else
            avx512_q8_x8_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        return;
    }
    if (xq && cpu_q8_int_eligible(w)) {
        if (avx512_has_vnni())
            avx512_q8v_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        else
            avx512_q8_gemv(y, ldy, xq, ldq, n, w, r0, r1);
        return;
    }
    switch (w->dtype) {
    case DTYPE_F32:
        gemv_f32(y, ldy, x, ldx, NULL, 0, n, w, r0, r1);
        break;
    case DTYPE_F16:
    case DTYPE_F16X8:
        gemv_f16(y, ldy, x, ldx, NULL, 0, n, w, r0, r1);
        break;
    case DTYPE_BF16:
    case DTYPE_BF16X8: /* the layout is read off the weight (gemv_tile_any) */
        gemv_bf16(y, ldy, x, ldx, NULL, 0, n, w, r0, r1);
        break;
    case DTYPE_Q8:
        gemv_q8(y, ldy, x, ldx, xq, ldq, n, w, r0, r1);
        break;
    case DTYPE_Q4:
        gemv_q4(y, ldy, x, ldx, xq, ldq, n, w, r0, r1);
        break;
    default:
        break;
    }
}

/* ---- conversion of whole rows to f32 ---------------------------------------------------- */

static void avx512_rows_to_f32(float *dst, const weight_t *w, int64_t r0, int64_t r1)
{
    if (w->dtype == DTYPE_Q4X8) {
        avx512_q4x8_rows_to_f32(dst, w, r0, r1);
        return;
    }
    if (w->dtype == DTYPE_Q8X8) {
        avx512_q8_x8_rows_to_f32(dst, w, r0, r1);
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
        /* Whole chunks of 32 columns (rowblock.h), two vectors each. */
        dtype_t et = cpu_rowblock_elem(dt);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = cpu_rowblock_at(w->data, rb, r, 0);
            float *d = dst + (r - r0) * cols;
            for (int64_t k = 0; k < cols; k += 32) {
                const uint8_t *c = row + (size_t)(k / 32) * CPU_ROWBLOCK_SPAN;
                _mm512_storeu_ps(d + k, ld16(et, c, 0));
                _mm512_storeu_ps(d + k + 16, ld16(et, c, 16));
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
                __m512 s = _mm512_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
                __m512 z = _mm512_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
                for (int64_t k = g * w->group; k < (g + 1) * w->group; k += 16)
                    _mm512_storeu_ps(d + k, _mm512_mul_ps(_mm512_sub_ps(ld16_codes(dt, row, k), z), s));
            }
            continue;
        }
        int64_t k = 0;
        switch (dt) {
        case DTYPE_F16:
            for (; k + 16 <= cols; k += 16)
                _mm512_storeu_ps(d + k, ld16(DTYPE_F16, row, k));
            if (k < cols)
                _mm512_mask_storeu_ps(d + k, tail_mask(cols - k),
                                      ld16_mask(DTYPE_F16, row, k, tail_mask(cols - k)));
            break;
        case DTYPE_BF16:
            for (; k + 16 <= cols; k += 16)
                _mm512_storeu_ps(d + k, ld16(DTYPE_BF16, row, k));
            if (k < cols)
                _mm512_mask_storeu_ps(d + k, tail_mask(cols - k),
                                      ld16_mask(DTYPE_BF16, row, k, tail_mask(cols - k)));
            break;
        default:
            memcpy(d, row, (size_t)cols * sizeof(float));
            break;
        }
    }
}

/* ---- prefill: f32 weights against transposed panels of x -------------------------------- */

static void avx512_gemm_pack(float *xp, const float *x, int64_t ldx, int m, int64_t cols)
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

/* acc[r][v] holds y for the 16 x rows of vector v of the panel and weight row r; one
 * broadcast weight feeds both vectors. */
AI void gemm_tile(float *y, int64_t ldy, const float *xp, int m, const float *wf, int64_t ldw,
                  int64_t cols, const int R)
{
    __m512 acc[GEMM_R][2];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm512_setzero_ps();
        acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < cols; k++) {
        __m512 x0 = _mm512_load_ps(xp + k * GEMM_P);
        __m512 x1 = _mm512_load_ps(xp + k * GEMM_P + 16);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 b = _mm512_set1_ps(wf[r * ldw + k]);
            acc[r][0] = _mm512_fmadd_ps(x0, b, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x1, b, acc[r][1]);
        }
    }
    _Alignas(64) float t[GEMM_R][GEMM_P];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_store_ps(t[r], acc[r][0]);
        _mm512_store_ps(t[r] + 16, acc[r][1]);
    }
    for (int i = 0; i < m; i++)
        for (int r = 0; r < R; r++)
            y[i * ldy + r] = t[r][i];
}

static void avx512_gemm_block(float *y, int64_t ldy, const float *xp, int m, const float *wf,
                              int64_t ldw, int64_t nr, int64_t cols)
{
    int64_t r = 0;
    for (; r + GEMM_R <= nr; r += GEMM_R)
        gemm_tile(y + r, ldy, xp, m, wf + r * ldw, ldw, cols, GEMM_R);
    for (; r + 4 <= nr; r += 4)
        gemm_tile(y + r, ldy, xp, m, wf + r * ldw, ldw, cols, 4);
    for (; r < nr; r++)
        gemm_tile(y + r, ldy, xp, m, wf + r * ldw, ldw, cols, 1);
}

/* ---- prefill of float weights in gemv's order (simd.h: gemm_wpack, gemm_dot) ---------- */

/* Tiles of 2 rows of x against 12 weight rows: 24 vectors of partial sums, the two x
 * vectors and one weight vector, 27 of the 32 registers. The panel is in L1 and the rows of
 * x come from L2, so the wide tile halves the bytes from L2 a multiply-add of the 4 x 6 tile
 * it replaced (which used the same 24 accumulators): on the Zen 5 VM, one thread, the
 * matmul loop over a block of 48 weight rows and 512 rows of x ran at medians of 77 against
 * 64 G multiply-adds/s (avx512) and 157 against 126 (avx512bf16), seven alternating rounds;
 * the tile alone, with its rows of x in L1, ran at the peak in both shapes. */
#define GD_FN(name) avx512_##name
#define GD_V __m512
#define GD_L 16
#define AVX512_GD_MR 2
#define AVX512_GD_NR 12
/* Blocks of 512 floats of x: each tile then carries its 24 vectors in and out of memory
 * once per 32 steps instead of 16. With 96 rows of x and 48 weight rows a block (matmul.c),
 * the carry and the block's part of x take 480 KiB, within the 1 MiB and more of L2 that
 * AVX-512 processors have. river bench --kernels, one thread, 512 rows, 2048x2048 and
 * 8192x2048, three alternating rounds on the Zen 5 VM: 80-86 against 79-84 G multiply-adds
 * a second (avx512), 155-171 against 154-166 (avx512bf16). */
#define AVX512_GEMM_KC 512
#define GD_MR AVX512_GD_MR
#define GD_NR AVX512_GD_NR
#define GD_ZERO() _mm512_setzero_ps()
#define GD_LOAD(p) _mm512_load_ps(p)
#define GD_LOADU(p) _mm512_loadu_ps(p)
#define GD_STORE(p, v) _mm512_store_ps(p, v)
#define GD_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define GD_SUMS(y, v, nr) avx512_sums_store(y, v, GD_NR, nr)
#define GD_LDW(et, p) ld16(et, p, 0)
#define GD_LDW_EO(p, s) ld16_eo(p, s)
#include "kernels/cpu/gemm_dot_x86.h"
#undef GD_LDW_EO

/* ---- bf16 weights in even/odd order ----------------------------------------------------- */

/* As at the AVX2 level (kernels_avx2.c says why): a chunk of 32 bf16 weights, one 64-byte
 * load, is the 16 even columns as f32 (the 32-bit lanes shifted left by 16) and the 16 odd
 * ones (the lanes with their low half cleared), one instruction each, where the plain
 * order widens 16 at a time in two (vpmovzxwd, vpslld). Within each block of 32 columns the
 * even ones come first; x is put in that order once per call, and prefill packs its panels
 * in it (gemm_wpack_eo), so a row has one set of bits whatever the batch. The avx512bf16
 * level multiplies bf16 weights with vdpbf16ps instead. */
#define EO_COLS 32

static int64_t eo_prep_floats(const weight_t *w)
{
    return w->cols;
}

static void eo_prep(float *xq, const float *x, int64_t ldx, int n, const weight_t *w)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    int64_t cols = w->cols;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * ldx;
        float *qi = xq + (int64_t)i * cols;
        for (int64_t k = 0; k < cols; k += EO_COLS) {
            __m512 a = _mm512_loadu_ps(xi + k), b = _mm512_loadu_ps(xi + k + 16);
            _mm512_storeu_ps(qi + k, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(qi + k + 16, _mm512_permutex2var_ps(a, odd, b));
        }
    }
}

/* R weight rows (rs bytes apart from w, their chunks cs bytes apart: rowblock.h) against N
 * rows of x (N <= 2, held in registers) in even/odd order; pf > 0 prefetches the row-major
 * rows pf bytes on. */
AI void eo_tile(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                size_t rs, size_t cs, int64_t cols, int64_t pf, const int R, const int N)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[CPU_ROWBLOCK_ROWS][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < cols; k += EO_COLS, w += cs) {
        if (cs != CPU_ROWBLOCK_CHUNK)
            cpu_rowblock_prefetch(w, R);
        else if (pf)
            gemv_prefetch(w - k * 2, rs, k, pf, DTYPE_BF16, R);
        __m512 xe[2], xo[2];
#pragma GCC unroll 2
        for (int i = 0; i < N; i++) {
            xe[i] = _mm512_loadu_ps(xq + i * ldq + k);
            xo[i] = _mm512_loadu_ps(xq + i * ldq + k + 16);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512i v = _mm512_loadu_si512(w + r * rs);
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
#pragma GCC unroll 2
            for (int i = 0; i < N; i++) {
                acc[r][i] = _mm512_fmadd_ps(we, xe[i], acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(wo, xo[i], acc[r][i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum16(acc[r][i]);
}

/* R rows (a block of 8, or 1) from row r against all n rows of x, two at a time (8 x 2
 * tiles, 16 accumulators, as gemv_rows takes row-blocked weights); the first pass
 * prefetches. */
AI void eo_rows(float *y, int64_t ldy, const float *xq, int64_t ldq, int n, const weight_t *w,
                int64_t r, int64_t pf, const int R)
{
    size_t rb = dtype_row_bytes(w->dtype, w->cols);
    int blocked = cpu_rowblock_is(w->dtype);
    const uint8_t *b = blocked ? cpu_rowblock_at(w->data, rb, r, 0)
                               : (const uint8_t *)w->data + (size_t)r * rb;
    size_t rs = blocked ? CPU_ROWBLOCK_CHUNK : rb;
    size_t cs = blocked ? CPU_ROWBLOCK_SPAN : CPU_ROWBLOCK_CHUNK;
    for (int i = 0; i < n;) {
        float *yi = y + i * ldy + r;
        const float *xi = xq + i * ldq;
        int64_t p = i == 0 ? pf : 0;
        if (n - i >= 2) {
            eo_tile(yi, ldy, xi, ldq, b, rs, cs, w->cols, p, R, 2);
            i += 2;
        } else {
            eo_tile(yi, ldy, xi, ldq, b, rs, cs, w->cols, p, R, 1);
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

/* ---- bf16 weights against bf16 x (the avx512bf16 level) --------------------------------- */

/* Where the processor has AVX512-BF16, vdpbf16ps multiplies 32 bf16 weights by 32 bf16
 * values of x and adds the pairs into 16 f32 lanes in one instruction: twice the
 * multiply-adds of an f32 FMA, and no conversion of the weights. x is rounded to bf16 once
 * per call (to nearest even, as llama.cpp does for bf16 weights), so this level's bits for
 * bf16 weights differ from the avx512 level's, as every level's do from the others'; within
 * it, decode (gemv) and prefill (gemm_dot) keep one vector of partial sums per output, lane l
 * adding columns 2l and 2l + 1 of each block of 32 in turn, and sum it with the same
 * reduction, so a row has the same bits whatever the batch. Only bf16 weights take these
 * kernels (cpu_kernels_for hands every other weight to the avx512 table). */

/* The floats of one row of x in bf16 pairs: whole blocks of 32 columns, zero past cols. */
static int64_t bf16d_prep_floats(const weight_t *w)
{
    return (w->cols + 31) / 32 * 16;
}

static void bf16d_prep(float *xq, const float *x, int64_t ldx, int n, const weight_t *w)
{
    int64_t cols = w->cols, ldq = bf16d_prep_floats(w);
    for (int i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * ldx;
        float *qi = xq + (int64_t)i * ldq;
        for (int64_t k = 0; k < cols; k += 32) {
            int64_t left = cols - k;
            __mmask16 m0 = left >= 16 ? (__mmask16)0xffff : tail_mask(left);
            __mmask16 m1 = left >= 32 ? (__mmask16)0xffff : left > 16 ? tail_mask(left - 16) : 0;
            __m512 lo = _mm512_maskz_loadu_ps(m0, xi + k);
            __m512 hi = _mm512_maskz_loadu_ps(m1, xi + k + 16);
            _mm512_storeu_si512(qi + k / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* R weight rows (rs bytes apart from w, their 64-byte chunks of 32 columns cs bytes apart:
 * rowblock.h) against N rows of bf16 x. */
AI void bf16d_tile(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                   size_t rs, size_t cs, int64_t cols, const int R, const int N)
{
    __m512 acc[CPU_ROWBLOCK_ROWS][3];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k < cols; k += 32, w += cs) {
        if (cs != CPU_ROWBLOCK_CHUNK)
            cpu_rowblock_prefetch(w, R);
        __mmask32 m = cols - k >= 32 ? (__mmask32)0xffffffffu
                                     : (__mmask32)((1u << (cols - k)) - 1u);
        __m512bh xv[3];
#pragma GCC unroll 3
        for (int i = 0; i < N; i++)
            xv[i] = (__m512bh)_mm512_loadu_si512(xq + i * ldq + k / 2);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + r * rs);
#pragma GCC unroll 3
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm512_dpbf16_ps(acc[r][i], wv, xv[i]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum16(acc[r][i]);
}

/* R rows from row r against all n rows of x, up to three at a time (24 accumulators). */
AI void bf16d_rows(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                   const weight_t *w, int64_t r, const int R)
{
    size_t rb = dtype_row_bytes(w->dtype, w->cols);
    int blocked = cpu_rowblock_is(w->dtype);
    const uint8_t *b = blocked ? cpu_rowblock_at(w->data, rb, r, 0)
                               : (const uint8_t *)w->data + (size_t)r * rb;
    size_t rs = blocked ? CPU_ROWBLOCK_CHUNK : rb;
    size_t cs = blocked ? CPU_ROWBLOCK_SPAN : CPU_ROWBLOCK_CHUNK;
    for (int i = 0; i < n;) {
        float *yi = y + i * ldy + r;
        const float *xi = xq + i * ldq;
        if (n - i >= 3) {
            bf16d_tile(yi, ldy, xi, ldq, b, rs, cs, w->cols, R, 3);
            i += 3;
        } else if (n - i == 2) {
            bf16d_tile(yi, ldy, xi, ldq, b, rs, cs, w->cols, R, 2);
            i += 2;
        } else {
            bf16d_tile(yi, ldy, xi, ldq, b, rs, cs, w->cols, R, 1);
            i += 1;
        }
    }
}

/* Reads x only as bf16d_prep leaves it: matmul.c prepares it whenever gemv_prep_floats
 * says so, which for this table is every call. */
static void bf16d_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                       int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    (void)x;
    (void)ldx;
    int64_t r = r0;
    /* Row-blocked weights come in whole blocks, and matmul.c hands out rows by 16. */
    for (; r + CPU_ROWBLOCK_ROWS <= r1; r += CPU_ROWBLOCK_ROWS)
        bf16d_rows(y, ldy, xq, ldq, n, w, r, CPU_ROWBLOCK_ROWS);
    for (; r < r1; r++)
        bf16d_rows(y, ldy, xq, ldq, n, w, r, 1);
}

/* The prefill kernels are gemm_dot_x86.h's, taking a pair of bf16 values as one 32-bit
 * element: each multiply-add is vdpbf16ps, and a vector of pairs is 64 bytes, one chunk of
 * the row-blocked layout (rowblock.h). With panels of CPU_ROWBLOCK_ROWS rows, a block of
 * row-blocked weights is therefore a panel already, one vector of each row in turn, and
 * matmul.c reads it where it is (gemm_w_in_place) instead of moving it: the move, which
 * reads every weight from memory before any multiply-add can start on it, took a tenth of
 * a 512-token prefill (perf, avx512bf16, 2 threads). Only weights of other layouts are
 * packed. Eight rows take tiles of three rows of x, 24 vectors of partial sums. */
#undef GD_FN
#undef GD_FMA
#undef GD_LDW
#undef GD_MR
#undef GD_NR
#define BF16D_GD_MR 3
#define BF16D_GD_NR CPU_ROWBLOCK_ROWS
#define GD_MR BF16D_GD_MR
#define GD_NR BF16D_GD_NR
#define GD_FN(name) avx512bf16_##name
#define GD_FMA(a, b, c) _mm512_dpbf16_ps(c, (__m512bh)(a), (__m512bh)(b))
#define GD_LDW(et, p) _mm512_loadu_ps((const float *)(p))
#include "kernels/cpu/gemm_dot_x86.h"

/* Columns are counted in bf16 values by the caller, in pairs by the template. */
static void bf16d_gemm_wpack(float *wp, const weight_t *w, int64_t r0, int64_t r1, int64_t k0,
                             int64_t k1)
{
    avx512bf16_gemm_wpack_et(wp, w, r0, r1, k0 / 2, k1 / 2, DTYPE_F32, 0);
}

static void bf16d_gemm_dot(float *c, float *y, int64_t ldy, const float *x, int64_t ldx, int m,
                           const float *wp, int nr, int64_t kc, int first)
{
    avx512bf16_gemm_dot(c, y, ldy, x, ldx, m, wp, nr, kc / 2, first);
}

/* ---- vector ops ------------------------------------------------------------------------- */

static float avx512_dot(const float *a, const float *b, int64_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= n; k += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(b + k + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 32), _mm512_loadu_ps(b + k + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 48), _mm512_loadu_ps(b + k + 48), a3);
    }
    for (; k + 16 <= n; k += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), a0);
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static float avx512_sumsq(const float *x, int64_t n)
{
    return avx512_dot(x, x, n);
}

static void avx512_scale_mul(float *out, const float *x, float s, const float *w, int64_t n)
{
    __m512 sv = _mm512_set1_ps(s);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(out + k, _mm512_mul_ps(_mm512_loadu_ps(w + k),
                                                _mm512_mul_ps(sv, _mm512_loadu_ps(x + k))));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + k),
                                 _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, x + k)));
        _mm512_mask_storeu_ps(out + k, m, v);
    }
}

static void avx512_add(float *y, const float *x, int64_t n)
{
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(y + k, _mm512_add_ps(_mm512_loadu_ps(y + k), _mm512_loadu_ps(x + k)));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        _mm512_mask_storeu_ps(y + k, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + k),
                                                      _mm512_maskz_loadu_ps(m, x + k)));
    }
}

/* exp(x) to about 2 ulp: x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r
 * and a scalef by 2^n, which also produces infinity at the top of the range. */
AI __m512 exp16(__m512 x)
{
    /* Below ln(FLT_MIN) the result is exactly 0 rather than a subnormal (which would slow
     * down the arithmetic that consumes it); exp(-inf) is 0 too. */
    __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365478515625f), _CMP_NLT_UQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n));
}

AI __m512 swiglu16(__m512 g, __m512 u)
{
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
}

static void avx512_swiglu(float *out, const float *g, const float *u, int64_t n)
{
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(out + k, swiglu16(_mm512_loadu_ps(g + k), _mm512_loadu_ps(u + k)));
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        _mm512_mask_storeu_ps(out + k, m,
                              swiglu16(_mm512_maskz_loadu_ps(m, g + k), _mm512_maskz_loadu_ps(m, u + k)));
    }
}

static float avx512_exp_sum(float *x, int64_t n, float max)
{
    __m512 mv = _mm512_set1_ps(max);
    __m512 s = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + k), mv));
        _mm512_storeu_ps(x + k, e);
        s = _mm512_add_ps(s, e);
    }
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + k), mv));
        _mm512_mask_storeu_ps(x + k, m, e);
        s = _mm512_add_ps(s, _mm512_maskz_mov_ps(m, e));
    }
    return _mm512_reduce_add_ps(s);
}

static float avx512_max(const float *x, int64_t n)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + k));
    if (k < n)
        mx = _mm512_mask_max_ps(mx, tail_mask(n - k), mx, _mm512_maskz_loadu_ps(tail_mask(n - k), x + k));
    return _mm512_reduce_max_ps(mx);
}

/* Attention reads K and V rows one head slice (hd floats) per position, kv_dim floats
 * apart: a stride the hardware prefetchers do not follow well, so the kernels prefetch the
 * rows ATTN_PF positions ahead themselves. */
#define ATTN_PF 16

/* Sums each of v[0..15] across its lanes: lane i of the result is the sum of v[i], by a
 * tree of shuffles and adds (about 45 instructions instead of 16 full reductions). */
AI __m512 reduce16(__m512 v[16])
{
    __m512 t[8], u[4];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Scores of 16 positions at a time: one accumulator per position, reduced together. */
static void avx512_attn_scores(float *s, int64_t sstride, const float *q, int G, int hd,
                               const float *const *rows, int64_t off, int64_t T,
                        float scale)
{
    __m512 sv = _mm512_set1_ps(scale);
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
        int nt = T - t0 < 16 ? (int)(T - t0) : 16;
        const float *kr[16];
        __mmask16 present = 0;
        for (int u = 0; u < 16; u++) {
            kr[u] = u < nt ? rows[t0 + u] : NULL;
            if (kr[u]) {
                present |= (__mmask16)(1u << u);
                kr[u] += off;
            } else {
                kr[u] = q; /* any readable address: its loads are fully masked */
            }
        }
        for (int g = 0; g < G; g++) {
            const float *qg = q + g * hd;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int u = 0; u < 16; u++)
                acc[u] = _mm512_setzero_ps();
            for (int j = 0; j < hd; j += 16) {
                __mmask16 m = hd - j >= 16 ? (__mmask16)0xffff : tail_mask(hd - j);
                __m512 qv = _mm512_maskz_loadu_ps(m, qg + j);
#pragma GCC unroll 16
                for (int u = 0; u < 16; u++) {
                    __mmask16 mu = (present >> u) & 1 ? m : 0;
                    acc[u] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(mu, kr[u] + j), acc[u]);
                }
                if (g == 0 && t0 + 16 < T) {
                    int64_t ahead = T - t0 - 16 < 16 ? T - t0 - 16 : 16;
                    for (int64_t u = 0; u < ahead; u++)
                        if (rows[t0 + 16 + u])
                            _mm_prefetch((const char *)(rows[t0 + 16 + u] + off + j), _MM_HINT_T0);
                }
            }
            __m512 r = _mm512_mul_ps(reduce16(acc), sv);
            r = _mm512_mask_blend_ps(present, _mm512_set1_ps(-INFINITY), r);
            _mm512_mask_storeu_ps(s + g * sstride + t0, tail_mask(nt), r);
        }
    }
}

/* GN heads (up to 4) and NV 16-float slices of the head (up to 4) accumulate in registers
 * over all positions; each V slice is loaded once for the GN heads. */
AI void attn_values_block(float *o, const float *p, int64_t pstride, int hd, int j0,
                          const float *const *rows, int64_t off, int64_t T, int pf,
                          const int GN, const int NV)
{
    __m512 acc[4][4];
    __mmask16 m[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        int left = hd - j0 - 16 * v;
        m[v] = left >= 16 ? (__mmask16)0xffff : tail_mask(left);
#pragma GCC unroll 4
        for (int g = 0; g < GN; g++)
            acc[g][v] = _mm512_maskz_loadu_ps(m[v], o + g * hd + j0 + 16 * v);
    }
    for (int64_t t = 0; t < T; t++) {
        if (pf && t + ATTN_PF < T && rows[t + ATTN_PF]) {
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                _mm_prefetch((const char *)(rows[t + ATTN_PF] + off + j0 + 16 * v), _MM_HINT_T0);
        }
        if (!rows[t])
            continue;
        const float *vr = rows[t] + off;
        __m512 vv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            vv[v] = _mm512_maskz_loadu_ps(m[v], vr + j0 + 16 * v);
#pragma GCC unroll 4
        for (int g = 0; g < GN; g++) {
            __m512 pg = _mm512_set1_ps(p[g * pstride + t]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                acc[g][v] = _mm512_fmadd_ps(pg, vv[v], acc[g][v]);
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
#pragma GCC unroll 4
        for (int g = 0; g < GN; g++)
            _mm512_mask_storeu_ps(o + g * hd + j0 + 16 * v, m[v], acc[g][v]);
}

#define ATTN_NV_CASES(GN)                                                                    \
    switch (nv) {                                                                            \
    case 1:                                                                                  \
        attn_values_block(og, pg, pstride, hd, j0, rows, off, T, pf, GN, 1);                      \
        break;                                                                               \
    case 2:                                                                                  \
        attn_values_block(og, pg, pstride, hd, j0, rows, off, T, pf, GN, 2);                      \
        break;                                                                               \
    case 3:                                                                                  \
        attn_values_block(og, pg, pstride, hd, j0, rows, off, T, pf, GN, 3);                      \
        break;                                                                               \
    default:                                                                                 \
        attn_values_block(og, pg, pstride, hd, j0, rows, off, T, pf, GN, 4);                      \
        break;                                                                               \
    }

static void avx512_attn_values(float *o, const float *p, int64_t pstride, int G, int hd,
                               const float *const *rows, int64_t off, int64_t T)
{
    for (int g0 = 0; g0 < G; g0 += 4) {
        int gn = G - g0 < 4 ? G - g0 : 4;
        float *og = o + g0 * hd;
        const float *pg = p + g0 * pstride;
        for (int j0 = 0; j0 < hd; j0 += 64) {
            int nv = (hd - j0 + 15) / 16;
            /* Only the first pass over the positions brings V in; later ones find it in
             * cache. */
            int pf = g0 == 0;
            switch (gn) {
            case 1:
                ATTN_NV_CASES(1);
                break;
            case 2:
                ATTN_NV_CASES(2);
                break;
            case 3:
                ATTN_NV_CASES(3);
                break;
            default:
                ATTN_NV_CASES(4);
                break;
            }
        }
    }
}

/* Four query heads (any rows) against four positions: 16 vectors of partial sums, each
 * the chain avx512_attn_scores runs for its pair, summed across lanes together by
 * reduce16, whose sum of a vector (the 128-bit quarters' sums, each ((e0 + e2) + (e1 +
 * e3)), added as (q0 + q1) + (q2 + q3)) does not depend on its place among the 16: each
 * score has avx512_attn_scores's bits. Each K vector loaded serves four heads and each q
 * vector four positions, where avx512_attn_scores loads a K vector for every head. Only
 * the first na heads and nt positions are stored (the others repeat a real one). */
AI void attn_scores_tile(float *const *sp, const float *const *qp, const float *const *kp,
                         __m512 sv, int na, int nt, const int hd)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int u = 0; u < 16; u++)
        acc[u] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < hd; j += 16) {
        __m512 qv[4], kv[4];
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++)
            qv[a] = _mm512_loadu_ps(qp[a] + j);
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            kv[b] = _mm512_loadu_ps(kp[b] + j);
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                acc[4 * a + b] = _mm512_fmadd_ps(qv[a], kv[b], acc[4 * a + b]);
    }
    __m512 r = _mm512_mul_ps(reduce16(acc), sv);
    if (na == 4 && nt == 4) {
        _mm_storeu_ps(sp[0], _mm512_castps512_ps128(r));
        _mm_storeu_ps(sp[1], _mm512_extractf32x4_ps(r, 1));
        _mm_storeu_ps(sp[2], _mm512_extractf32x4_ps(r, 2));
        _mm_storeu_ps(sp[3], _mm512_extractf32x4_ps(r, 3));
        return;
    }
    _Alignas(64) float rs[16];
    _mm512_store_ps(rs, r);
    for (int a = 0; a < na; a++)
        for (int b = 0; b < nt; b++)
            sp[a][b] = rs[4 * a + b];
}

static void avx512_attn_scores_rows(float *s, int64_t sstride, const float *q, int64_t qstride,
                                    int m, int G, int hd, const float *const *rows,
                                    int64_t off, int64_t T, float scale)
{
    if (hd % 16 != 0) {
        for (int i = 0; i < m; i++)
            avx512_attn_scores(s + (int64_t)i * G * sstride, sstride, q + i * qstride, G, hd,
                               rows, off, T, scale);
        return;
    }
    const __m512 sv = _mm512_set1_ps(scale);
    const int nq = m * G;
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
        int nt = T - t0 < 4 ? (int)(T - t0) : 4;
        const float *kp[4];
        for (int b = 0; b < 4; b++) {
            const float *r = b < nt ? rows[t0 + b] : NULL;
            kp[b] = r ? r + off : q; /* any hd readable floats: the score is not kept */
        }
        for (int64_t t = t0 + ATTN_PF; t < t0 + ATTN_PF + 4 && t < T; t++)
            if (rows[t])
                for (int j = 0; j < hd; j += 16)
                    _mm_prefetch((const char *)(rows[t] + off + j), _MM_HINT_T0);
        /* Query head qi is head g of row i: counted along instead of divided. */
        int ci = 0, cg = 0;
        for (int q0 = 0; q0 < nq; q0 += 4) {
            int na = nq - q0 < 4 ? nq - q0 : 4;
            const float *qp[4];
            float *sp[4];
            for (int a = 0; a < na; a++) {
                qp[a] = q + ci * qstride + (int64_t)cg * hd;
                sp[a] = s + (int64_t)(q0 + a) * sstride + t0;
                if (++cg == G) {
                    cg = 0;
                    ci++;
                }
            }
            for (int a = na; a < 4; a++)
                qp[a] = qp[0];
            if (hd == 64)
                attn_scores_tile(sp, qp, kp, sv, na, nt, 64);
            else
                attn_scores_tile(sp, qp, kp, sv, na, nt, hd);
        }
        for (int b = 0; b < nt; b++)
            if (!rows[t0 + b])
                for (int qi = 0; qi < nq; qi++)
                    s[qi * sstride + t0 + b] = -INFINITY;
    }
}

/* Six query heads (any rows) against a 64-float slice of the head: 24 chains, each the one
 * avx512_attn_values runs for its value (the same multiply-adds over the positions in
 * turn), each V vector loaded once for six heads. */
AI void attn_values_tile6(float *const *op, const float *const *pp, const float *const *rows,
                          int64_t off, int64_t T, int j0, int pf, const int R)
{
    __m512 a[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            a[r][v] = _mm512_loadu_ps(op[r] + j0 + 16 * v);
    for (int64_t t = 0; t < T; t++) {
        if (pf && t + ATTN_PF < T && rows[t + ATTN_PF])
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                _mm_prefetch((const char *)(rows[t + ATTN_PF] + off + j0 + 16 * v), _MM_HINT_T0);
        if (!rows[t])
            continue;
        const float *vr = rows[t] + off + j0;
        __m512 vv[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            vv[v] = _mm512_loadu_ps(vr + 16 * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m512 b = _mm512_set1_ps(pp[r][t]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                a[r][v] = _mm512_fmadd_ps(b, vv[v], a[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            _mm512_storeu_ps(op[r] + j0 + 16 * v, a[r][v]);
}

static void avx512_attn_values_rows(float *o, int64_t ostride, const float *p, int64_t pstride,
                                    int m, int G, int hd, const float *const *rows, int64_t off,
                                    int64_t T)
{
    if (hd % 64 != 0) {
        for (int i = 0; i < m; i++)
            avx512_attn_values(o + i * ostride, p + (int64_t)i * G * pstride, pstride, G, hd,
                               rows, off, T);
        return;
    }
    const int nq = m * G;
    int ci = 0, cg = 0;
    for (int q0 = 0; q0 < nq; q0 += 6) {
        int R = nq - q0 < 6 ? nq - q0 : 6;
        float *op[6];
        const float *pp[6];
        for (int r = 0; r < R; r++) {
            op[r] = o + ci * ostride + (int64_t)cg * hd;
            pp[r] = p + (int64_t)(q0 + r) * pstride;
            if (++cg == G) {
                cg = 0;
                ci++;
            }
        }
        for (int j0 = 0; j0 < hd; j0 += 64) {
            /* Only the first pass over the positions brings V in. */
            int pf = q0 == 0 && j0 == 0;
            switch (R) {
            case 6: attn_values_tile6(op, pp, rows, off, T, j0, pf, 6); break;
            case 5: attn_values_tile6(op, pp, rows, off, T, j0, pf, 5); break;
            case 4: attn_values_tile6(op, pp, rows, off, T, j0, pf, 4); break;
            case 3: attn_values_tile6(op, pp, rows, off, T, j0, pf, 3); break;
            case 2: attn_values_tile6(op, pp, rows, off, T, j0, pf, 2); break;
            default: attn_values_tile6(op, pp, rows, off, T, j0, pf, 1); break;
            }
        }
    }
}

static uint64_t avx512_read_sum(const void *buf, size_t bytes)
{
    const __m512i *p = buf;
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    __m512i a2 = _mm512_setzero_si512(), a3 = _mm512_setzero_si512();
    for (size_t i = 0; i < bytes / 64; i += 4) {
        cpu_prefetch_page_ahead((uintptr_t)(p + i)); /* as the decode tiles (prefetch.h) */
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 3));
    }
    __m512i s = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(s);
}

/* Sixteen elements at a time; widening is exact, so the floats are kv_row_to_f32's. */
static void avx512_kv_to_f32(float *dst, dtype_t dt, const void *base, const float *scales,
                             int64_t off, int64_t n)
{
    int64_t j = 0;
    if (dt == DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)base + off;
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_ps(dst + j,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + j))));
    } else if (dt == DTYPE_BF16) {
        const uint16_t *h = (const uint16_t *)base + off;
        for (; j + 16 <= n; j += 16) {
            __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + j)));
            _mm512_storeu_ps(dst + j, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
    } else if (dt == DTYPE_Q8) {
        const int8_t *c = (const int8_t *)base + off;
        for (; j + 16 <= n; j += 16) {
            __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(c + j)));
            __m512 sc = _mm512_set1_ps(scales[(off + j) / KV_Q8_BLOCK]);
            _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_cvtepi32_ps(w), sc));
        }
    }
    if (j < n)
        kv_row_to_f32(dt, base, scales, off + j, dst + j, n - j);
}

/* ---- compute peak ------------------------------------------------------------------------ */

/* At full width, as the float matmuls run. */
PEAK_FN static float avx512_peak_f32(int64_t iters)
{
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
#define INIT(i) _mm512_set1_ps((float)(i))
#define STEP(a) _mm512_fmadd_ps(a, m, c)
    return _mm512_reduce_add_ps(PEAK_ROUNDS(__m512, iters, INIT, STEP, _mm512_add_ps));
#undef INIT
#undef STEP
}

/* vdpbf16ps at full width: 32 multiply-adds an instruction, the float peak of the
 * avx512bf16 level, whose bf16 matmuls run it. */
PEAK_FN static float avx512bf16_peak_f32(int64_t iters)
{
    const __m512bh m = (__m512bh)_mm512_set1_epi32(0x3f803f80); /* 1.0 twice */
    const __m512bh c = (__m512bh)_mm512_set1_epi32(0x358637bd); /* about 1e-6 */
#define INIT(i) _mm512_set1_ps((float)(i))
#define STEP(a) _mm512_dpbf16_ps(a, m, c)
    return _mm512_reduce_add_ps(PEAK_ROUNDS(__m512, iters, INIT, STEP, _mm512_add_ps));
#undef INIT
#undef STEP
}

/* The 8-bit peak at full width: vpdpbusd where the processor has VNNI, else vpmaddubsw
 * (each chain fed its own products as the unsigned operand), 64 products a chain and round.
 * The Q8/Q4 kernels run 256-bit integer code, so their fraction of this peak is the fraction
 * of what the processor could do, not of what their width allows. */
PEAK_FN static int32_t avx512_peak_i8(int64_t iters)
{
    const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
#define INIT(i) _mm512_set1_epi8((char)((i) + 1))
#define DOT(a) _mm512_dpbusd_epi32(a, w, x)
#define MADD(a) _mm512_maddubs_epi16(a, x)
    __m512i s = avx512_has_vnni() ? PEAK_ROUNDS(__m512i, iters, INIT, DOT, _mm512_xor_si512)
                                  : PEAK_ROUNDS(__m512i, iters, INIT, MADD, _mm512_xor_si512);
#undef INIT
#undef DOT
#undef MADD
    /* Two lanes folded by xor: the lanes wrap, and a sum of them in int (what
     * _mm512_reduce_add_epi32 computes) overflows once the round count is large. */
    return _mm_extract_epi32(_mm512_castsi512_si128(s), 0) ^
           _mm_extract_epi32(_mm512_extracti32x4_epi32(s, 3), 3);
}

/* The Q8X8 prefill tile of this level with VNNI (q8_x86.h: x8_tile_z, 4 x 4 in 512-bit
 * vpdpbusd), one set of 256 columns a round, as x86_peak_q8_tile_maddubs does for the
 * 256-bit tile (simd.h: peak_q8_tile): each of the 16 dot products takes four vpdpbusd, then
 * its two halves are added, converted, scaled by the weight row's scales (from f16) times
 * x's, and added to its f32 sums in memory. Without VNNI the level runs that 256-bit tile,
 * two rounds of it for one of these (the same multiply-adds). */
#define AVX512_Q8_TILE_MACS (4 * 4 * 4 * 64)
_Static_assert(AVX512_Q8_TILE_MACS == 2 * X86_Q8_TILE_MACS, "a round of either tile");
PEAK_FN static int32_t avx512_peak_q8_tile(int64_t iters)
{
    if (!avx512_has_vnni())
        return x86_peak_q8_tile_maddubs(2 * iters);
    enum { R = 4, N = 4 };
    _Alignas(64) uint8_t q[4][R][64];
    _Alignas(64) int8_t x8[N][4][64];
    _Alignas(32) int32_t z[N][8];
    _Alignas(32) uint16_t sh[R][8];
    _Alignas(32) float dv[N][8];
    _Alignas(64) __m256 acc[R][N];
    x86_q8_tile_operands((uint8_t *)q, (int)sizeof q, (int8_t *)x8, (int)sizeof x8, z, dv, N, sh,
                         R);
    memset(acc, 0, sizeof acc);
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile("" : "+m"(acc), "+m"(q), "+m"(x8), "+m"(z), "+m"(sh), "+m"(dv));
        __m512i dot[R][N];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            __m512i z0 = _mm512_zextsi256_si512(_mm256_load_si256((const __m256i *)z[i]));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                dot[r][i] = z0;
        }
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m512i xv[N];
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                xv[i] = _mm512_load_si512((const void *)x8[i][v]);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i w = _mm512_load_si512((const void *)q[v][r]);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++)
                    dot[r][i] = _mm512_dpbusd_epi32(dot[r][i], w, xv[i]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 sc = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)sh[r]));
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                __m256i d = _mm256_add_epi32(_mm512_castsi512_si256(dot[r][i]),
                                             _mm512_extracti64x4_epi64(dot[r][i], 1));
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d),
                                            _mm256_mul_ps(sc, _mm256_load_ps(dv[i])), acc[r][i]);
            }
        }
    }
    return x86_fold_sums(&acc[0][0], R * N);
}

/* The fields the tables of this file share. */
#define AVX512_COMMON_FIELDS \
    .q4x8 = 1, \
    .q8x8 = 1, \
    .rowblock = 1, \
    .gemv_x8_block = avx512_gemv_x8_block, \
    .gemm_panel = GEMM_P, \
    .gemm_pack = avx512_gemm_pack, \
    .gemm_block = avx512_gemm_block, \
    .rows_to_f32 = avx512_rows_to_f32, \
    .dot = avx512_dot, \
    .sumsq = avx512_sumsq, \
    .scale_mul = avx512_scale_mul, \
    .add = avx512_add, \
    .swiglu = avx512_swiglu, \
    .attn_scores = avx512_attn_scores, \
    .attn_values = avx512_attn_values, \
    .attn_scores_rows = avx512_attn_scores_rows, \
    .attn_values_rows = avx512_attn_values_rows, \
    .kv_to_f32 = avx512_kv_to_f32, \
    .kv_from_f32 = x86_kv_from_f32, \
    .exp_sum = avx512_exp_sum, \
    .max = avx512_max, \
    .read_sum = avx512_read_sum, \
    .peak_i8 = avx512_peak_i8, \
    .peak_q8_tile = avx512_peak_q8_tile, \
    .peak_macs_i8 = PEAK_CHAINS * 64, \
    .peak_macs_q8_tile = AVX512_Q8_TILE_MACS,

/* The fields of the avx512 level's two tables (f32 multiply-adds) beyond those. */
#define AVX512_F32_FIELDS \
    .level = CPU_SIMD_AVX512, \
    .gemm_mr = AVX512_GD_MR, \
    .gemm_nr = AVX512_GD_NR, \
    .gemm_kc = AVX512_GEMM_KC, \
    .gemm_lanes = GD_L, \
    .gemm_dot = avx512_gemm_dot, \
    .peak_f32 = avx512_peak_f32, \
    .peak_macs_f32 = PEAK_CHAINS * 16,

const cpu_kernels_t cpu_kernels_avx512 = {
    AVX512_COMMON_FIELDS
    AVX512_F32_FIELDS
    .gemv = avx512_gemv,
    .gemv_prep_floats = avx512_gemv_prep_floats,
    .gemv_prep = avx512_gemv_prep,
    .gemm_wpack = avx512_gemm_wpack,
};

/* bf16 weights of whole blocks of 32 columns at the avx512 level (cpu_kernels_for): the
 * even/odd order, x prepared in it for decode and prefill alike. */
const cpu_kernels_t cpu_kernels_avx512_bf16 = {
    AVX512_COMMON_FIELDS
    AVX512_F32_FIELDS
    .gemv = eo_gemv,
    .gemv_prep_floats = eo_prep_floats,
    .gemv_prep = eo_prep,
    .gemm_wpack = avx512_gemm_wpack_eo,
    .gemm_x_cols_per_float = 1,
};

/* The avx512bf16 level: the avx512 level's kernels, but bf16 weights' matmuls on vdpbf16ps
 * against x in bf16 (cpu_kernels_for gives this table to bf16 weights only). */
const cpu_kernels_t cpu_kernels_avx512bf16 = {
    AVX512_COMMON_FIELDS
    .level = CPU_SIMD_AVX512BF16,
    .gemv = bf16d_gemv,
    .gemv_prep_floats = bf16d_prep_floats,
    .gemv_prep = bf16d_prep,
    .gemm_mr = BF16D_GD_MR,
    .gemm_nr = BF16D_GD_NR,
    .gemm_kc = AVX512_GEMM_KC,
    .gemm_w_in_place = 1,
    .gemm_lanes = 32, /* bf16 columns a vector of pairs */
    .gemm_x_cols_per_float = 2,
    .gemm_wpack = bf16d_gemm_wpack,
    .gemm_dot = bf16d_gemm_dot,
    .peak_f32 = avx512bf16_peak_f32,
    .peak_macs_f32 = PEAK_CHAINS * 32,
};
