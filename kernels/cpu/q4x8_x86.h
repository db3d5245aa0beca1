/* The Q4X8 decode kernel (layout: q4x8.h) in 256-bit integer code, included by
 * kernels_avx2.c and kernels_avx512.c, which compile it with their own flags. Before
 * including, define Q4X8_FN(name) (the names it defines) and Q4X8_VNNI (1: the
 * multiply-adds are vpdpbusd, which needs AVX-512 VNNI with VL; 0: vpmaddubsw + vpmaddwd).
 * The includer provides AI, ld8_f16_tail and kernels/cpu/x86_util.h.
 *
 * x is quantized once per call (Q4X8_FN(prep)): per block of 32 columns d = max|x| / 127
 * and x8 = round(x / d), stored in the order the weight lanes want; then the block scales
 * and, per weight group, the sum of the dequantized x (for the zero points:
 * sum_k (q_k - z) s x_k = s sum_k q_k x_k - s z sum_k x_k).
 *
 * xq row (ldq floats): x8 as cols bytes (per set of 256 columns, 8 vectors of 32 bytes:
 * vector 2p+h, lane j, byte t = x8 of column 32j + 8p + 4h + t of the set), then cols/32
 * block scales d, then the cols/group group sums (zero padded to a multiple of 8), then
 * cols/32 int32: each block's sum of x8 times zfold (below), which the integer sums of a
 * weight whose zeros are all one integer start from, so that its zero terms are exact
 * (cols/16 for groups of 16: one a half block, prep_floats). */

#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/q4x8.h"

/* Where in a row of xq (floats from its start) the folded block sums begin. */
AI int64_t Q4X8_FN(zsums_at)(int64_t cols, int64_t ng)
{
    return cols / 4 + cols / 32 + (ng + 7) / 8 * 8;
}

/* The factor of each block's sum of x8 that w's integer sums start from. With every zero
 * the integer z (weight_t.zero_int: llama.cpp's Q4_0, Q5_0 and Q8_0), sum_k (q_k - z) x8_k
 * is sum_k q_k x8_k - z sum_k x8_k, exact in 32 bits, and no zero term is left for f32:
 * the zero terms had been a fifth of a Q8X8 prefill tile's time (perf), and 512 rows of x
 * ran 1.14-1.3x as fast without them. Q8X8 codes without VNNI are taken as q - 128
 * (q8_x86.h), so theirs is 128 - z: 0 at z 128, where nothing is left to add. 0 also where
 * the zeros are not all one integer (HQQ's), whose tiles take the zero terms in f32
 * (zero_terms). */
AI int32_t Q4X8_FN(zfold)(const weight_t *w)
{
    if (!w->zero_int)
        return 0;
    return w->dtype == DTYPE_Q8X8 && !Q4X8_VNNI ? 128 - w->zero_int : -w->zero_int;
}

/* Groups of 16 columns (Q8X8 only: llama.cpp's Q6_K) are the halves of a block, so each
 * block has two folded sums; in a set they are stored as the eight first halves' sums, then
 * the eight second halves'. */
__attribute__((unused)) static int64_t Q4X8_FN(prep_floats)(const weight_t *w)
{
    int64_t f = Q4X8_FN(zsums_at)(w->cols, w->cols / w->group) +
                w->cols / (w->group == 16 ? 16 : 32);
    return (f + 15) / 16 * 16; /* rows stay 64-byte aligned */
}

__attribute__((unused)) static void Q4X8_FN(prep)(float *xq, const float *x, int64_t ldx, int n, const weight_t *w)
{
    int64_t ldq = Q4X8_FN(prep_floats)(w), cols = w->cols;
    int64_t nb = cols / 32, ng = cols / w->group;
    int bpg = w->group / 32; /* blocks per group: a multiple of 32, or 0 for halves (16) */
    int32_t zf = Q4X8_FN(zfold)(w);
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * ldx;
        float *qi = xq + i * ldq;
        int8_t *x8 = (int8_t *)qi;
        float *d = qi + cols / 4, *xs = d + nb;
        int32_t *xz = (int32_t *)(qi + Q4X8_FN(zsums_at)(cols, ng));
        for (int64_t g = 0; g < (ng + 7) / 8 * 8; g++)
            xs[g] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = xi + b * 32;
            float amax = x86_absmax(xb, 32);
            __m256 iv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            d[b] = amax / 127.0f;
            _Alignas(32) int8_t t[32];
            x86_pack32(t, xb, iv);
            /* Column o of block j goes to vector o/4 (= 2p+h), lane j, byte o%4: the eight
             * groups of four columns of the block land four bytes apart in eight vectors. */
            int8_t *set = x8 + b / 8 * Q4X8_SET;
            int j = (int)(b % 8), half[2] = {0, 0};
            for (int o = 0; o < 32; o += 4) {
                memcpy(set + (o / 4) * 32 + j * 4, t + o, 4);
                half[o / 16] += t[o] + t[o + 1] + t[o + 2] + t[o + 3];
            }
            if (bpg == 0) {
                xs[2 * b] = d[b] * (float)half[0];
                xs[2 * b + 1] = d[b] * (float)half[1];
                xz[b / 8 * 16 + j] = zf * half[0];
                xz[b / 8 * 16 + 8 + j] = zf * half[1];
            } else {
                int sum = half[0] + half[1];
                xs[b / bpg] += d[b] * (float)sum;
                xz[b] = zf * sum;
            }
        }
    }
}

/* The multiply-add of 32 codes (u8, one per byte) with 32 x8 values into 8 int32 lanes:
 * lane j gains the sum of its four products. Without VNNI the pair sums stay 16-bit in s16
 * (|pair| <= 2 * 15 * 127 = 3810, eight of them per set <= 30480) and widen once a set. */
#if Q4X8_VNNI
#define Q4X8_MADD(acc, w8, x8v) (acc) = _mm256_dpbusd_epi32((acc), (w8), (x8v))
#else
/* The empty asm pins each sum in its register: integer adds reassociate, and GCC otherwise
 * turns the 32 adds into one tree per set, computing (and spilling to the stack) every
 * product first. */
#define Q4X8_MADD(acc, w8, x8v)                                                         \
    do {                                                                                \
        (acc) = _mm256_add_epi16((acc), _mm256_maddubs_epi16((w8), (x8v)));            \
        __asm__("" : "+x"(acc));                                                        \
    } while (0)
#endif

/* The zero points' share of the integer kernels' sums: acc[r][i] -= s_g (z_g - zshift)
 * xs_i[g] over the groups g of weight row r0 + r, eight groups a vector, lane by lane (acc
 * is summed across lanes at the end anyway); xs_i (ldq floats apart, ng padded to a
 * multiple of 8 with zeros) holds row i's sum of dequantized x per group. zshift is 128
 * for Q8 codes taken as q - 128, else 0. The AVX2 level's Q4/Q8 tiles use it too. */
AI void Q4X8_FN(zero_terms)(__m256 acc[][4], const weight_t *wt, int64_t r0, int64_t ng,
                            const float *xs, int64_t ldq, float zshift, const int R,
                            const int N)
{
    for (int64_t gb = 0; gb < ng; gb += 8) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 s = ld8_f16_tail(wt->scales + (r0 + r) * ng + gb, ng - gb);
            __m256 z = ld8_f16_tail(wt->zeros + (r0 + r) * ng + gb, ng - gb);
            if (zshift != 0.0f)
                z = _mm256_sub_ps(z, _mm256_set1_ps(zshift));
            __m256 sz = _mm256_mul_ps(s, z);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm256_fnmadd_ps(sz, _mm256_loadu_ps(xs + i * ldq + gb), acc[r][i]);
        }
    }
}

/* What the tiles of one call share, worked out once per call: the integer divisions
 * behind it cost as much as a set of multiply-adds when done per tile. */
typedef struct {
    int64_t ng, nsets;
    __m256i gidx;  /* lane j of a set is block j: its group within the set's groups */
    int64_t gstep; /* groups per set (groups up to 256), else 0 */
    int spg;       /* sets per group (groups of 256 or more), else 1 */
} Q4X8_FN(geom_t);

AI Q4X8_FN(geom_t) Q4X8_FN(geom)(const weight_t *wt)
{
    int group = wt->group;
    Q4X8_FN(geom_t) g = {.ng = wt->cols / group, .nsets = wt->cols / Q4X8_SET};
    g.gidx = group <= Q4X8_SET ? _mm256_setr_epi32(0, 32 / group, 64 / group, 96 / group,
                                                   128 / group, 160 / group, 192 / group,
                                                   224 / group)
                               : _mm256_setzero_si256();
    g.gstep = group <= Q4X8_SET ? Q4X8_SET / group : 0;
    g.spg = group <= Q4X8_SET ? 1 : group / Q4X8_SET;
    return g;
}

/* A weight row's scales for the eight blocks of a set, from its group at off (lane j:
 * block j's group, gidx), for the 512-bit prefill tiles. Where the scales do not end
 * within the next eight they are read without a mask, and groups of 32 (gstep 8, the
 * identity) without the permutation: the same values, and 1.1-1.2x a Q8X8 tile's speed at
 * 512 rows of x (river bench --kernels, one thread); in the decode tiles it made no
 * difference past the noise for Q8X8 and ran Q4X8 1-5 % slower, so they keep their own. */
AI __m256 Q4X8_FN(set_scales)(const weight_t *wt, int64_t off, int64_t ng, int64_t gstep,
                              __m256i gidx)
{
    int64_t left = wt->rows * ng - off;
    if (left >= 8) {
        __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wt->scales + off)));
        return gstep == 8 ? s : _mm256_permutevar8x32_ps(s, gidx);
    }
    return _mm256_permutevar8x32_ps(ld8_f16_tail(wt->scales + off, left), gidx);
}

/* A weight row's scales for half h of the eight blocks of a set whose groups are 16
 * columns (Q8X8 only), from the set's sixteen at sc16: lane j takes group 2j + h. */
AI __m256 Q4X8_FN(half_scales)(const uint16_t *sc16, int h)
{
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc16));
    __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc16 + 8)));
    /* Lanes a0 a2 b0 b2 | a4 a6 b4 b6 (odd ones for h), then the middle pairs swapped. */
    __m256 e = h ? _mm256_shuffle_ps(a, b, 0xdd) : _mm256_shuffle_ps(a, b, 0x88);
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xd8));
}

/* R weight rows (from row r0 of wt, rb bytes apart at w) against N rows of xq.
 *
 * The f32 sums (acc) are touched once a set, the integer dot products (dot) 32 times: acc
 * is kept in memory (the empty asm below makes the compiler store and reload it around
 * each set), so that the R x N dot products, the unpacked codes and the mask have the 16
 * vector registers to themselves. Without it, GCC spills dot products inside the set. */
AI void Q4X8_FN(tile)(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                      size_t rb, const weight_t *wt, const Q4X8_FN(geom_t) *geo, int64_t r0,
                      int64_t pf, const int R, const int N)
{
    int64_t cols = wt->cols;
    const int64_t ng = geo->ng, nsets = geo->nsets;
    const int8_t *x8 = (const int8_t *)xq;
    const int64_t ldq8 = ldq * 4;
    const float *xd = xq + cols / 4, *xs = xd + cols / 32;
    const int32_t *xz = (const int32_t *)(xq + Q4X8_FN(zsums_at)(cols, ng));
    const bool fold = Q4X8_FN(zfold)(wt) != 0;
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    if (!fold)
        Q4X8_FN(zero_terms)(acc, wt, r0, ng, xs, ldq, 0.0f, R, N);
    /* The set's first group advances by gstep every set, or by one every spg sets. */
    const __m256i gidx = geo->gidx;
    const int64_t gstep = geo->gstep;
    const int spg = geo->spg;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#if !Q4X8_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    /* Rows shorter than a page share theirs, and each page gets a line CPU_PF_PAGE_BYTES
     * ahead (prefetch.h) as a row starts on it. river bench --kernels at one row of x
     * (Zen 5, 2 threads, five alternating rounds): 8192 x 2048 and 2048 x 2048 1.24-1.32x
     * at avx2 and avx512bf16. Rows of 4 KiB and more are a page or more each, whose pages
     * the prefetch pf ahead (a block on) already starts; touching them too measured
     * 0.94-1.05x. The tiles of four rows of x (n >= 4, compute-bound) keep their code:
     * with the touch in them too, 8 rows of x read 0.82-0.97x. */
    const bool touch = N <= 2 && rb < 4096;
    int64_t g0 = 0;
    int in_group = 0;
    for (int64_t s = 0; s < nsets; s++) {
        __asm__ volatile("" : "+m"(acc));
        /* With VNNI each block's sum starts from its folded zero term; without, the 16-bit
         * pair sums have no room for it, and it is added once they are widened. */
        __m256i dot[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            __m256i z0 = Q4X8_VNNI && fold
                             ? _mm256_loadu_si256((const __m256i *)(xz + i * ldq + s * 8))
                             : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                dot[r][i] = z0;
        }
        const uint8_t *ws = w + s * Q4X8_SET_BYTES;
        if (pf)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)(ws + r * rb + pf), _MM_HINT_T0);
                _mm_prefetch((const char *)(ws + r * rb + pf + 64), _MM_HINT_T0);
                if (touch)
                    cpu_prefetch_page_ahead((uintptr_t)(ws + r * rb));
            }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i b = _mm256_loadu_si256((const __m256i *)(ws + r * rb + p * 32));
                __m256i lo = _mm256_and_si256(b, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++) {
                    const int8_t *xv = x8 + i * ldq8 + s * Q4X8_SET + p * 64;
                    Q4X8_MADD(dot[r][i], lo, _mm256_load_si256((const __m256i *)xv));
                    Q4X8_MADD(dot[r][i], hi, _mm256_load_si256((const __m256i *)(xv + 32)));
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* Eight scales from the set's first group: lanes past its own groups are read
             * (the next row's, unused) except at the very end of the array, where only what
             * is left is. */
            int64_t off = (r0 + r) * ng + g0, left = wt->rows * ng - off;
            __m256 sc = ld8_f16_tail(wt->scales + off, left < 8 ? left : 8);
            sc = _mm256_permutevar8x32_ps(sc, gidx);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                __m256 dv = _mm256_loadu_ps(xd + i * ldq + s * 8);
#if Q4X8_VNNI
                __m256i d32 = dot[r][i];
#else
                __m256i d32 = _mm256_madd_epi16(dot[r][i], ones);
                if (fold)
                    d32 = _mm256_add_epi32(
                        d32, _mm256_loadu_si256((const __m256i *)(xz + i * ldq + s * 8)));
#endif
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d32), _mm256_mul_ps(sc, dv),
                                            acc[r][i]);
            }
        }
        if (++in_group == spg) {
            in_group = 0;
            g0 += gstep ? gstep : 1;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum8(acc[r][i]);
}

#if Q4X8_VNNI && defined(Q4X8_ZMM)
/* tile at 4 x 4 with 512-bit vpdpbusd (Q4X8_ZMM: the includer compiles AVX-512). A load
 * of 64 bytes is code vectors p and p + 1 of the set; their low nibbles pair with x
 * vectors 2p and 2p + 2, their high ones with 2p + 1 and 2p + 3, so the unpacked halves
 * are regrouped (vshufi64x2) as [low p | high p] and [low p+1 | high p+1], each against
 * 64 contiguous bytes of x. Lanes j and j + 8 of a dot product vector then hold parts of
 * block j, and their sum in 32-bit integers is the 256-bit tile's: the bits stay. */
AI void Q4X8_FN(tile_z)(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                        size_t rb, const weight_t *wt, const Q4X8_FN(geom_t) *geo, int64_t r0,
                        int64_t pf)
{
    enum { R = 4, N = 4 };
    int64_t cols = wt->cols;
    const int64_t ng = geo->ng, nsets = geo->nsets;
    const int8_t *x8 = (const int8_t *)xq;
    const int64_t ldq8 = ldq * 4;
    const float *xd = xq + cols / 4, *xs = xd + cols / 32;
    const int32_t *xz = (const int32_t *)(xq + Q4X8_FN(zsums_at)(cols, ng));
    const bool fold = Q4X8_FN(zfold)(wt) != 0;
    __m256 acc[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    if (!fold)
        Q4X8_FN(zero_terms)(acc, wt, r0, ng, xs, ldq, 0.0f, R, N);
    const __m256i gidx = geo->gidx;
    const int64_t gstep = geo->gstep;
    const int spg = geo->spg;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    int64_t g0 = 0;
    int in_group = 0;
    for (int64_t s = 0; s < nsets; s++) {
        __asm__ volatile("" : "+m"(acc));
        __m512i dot[R][N];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            __m512i z0 = fold ? _mm512_zextsi256_si512(_mm256_loadu_si256(
                                    (const __m256i *)(xz + i * ldq + s * 8)))
                              : _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                dot[r][i] = z0;
        }
        const uint8_t *ws = w + s * Q4X8_SET_BYTES;
        if (pf)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)(ws + r * rb + pf), _MM_HINT_T0);
                _mm_prefetch((const char *)(ws + r * rb + pf + 64), _MM_HINT_T0);
            }
#pragma GCC unroll 2
        for (int p = 0; p < 4; p += 2) {
            __m512i xa[N], xb[N];
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                const int8_t *xv = x8 + i * ldq8 + s * Q4X8_SET + p * 64;
                xa[i] = _mm512_loadu_si512((const void *)xv);
                xb[i] = _mm512_loadu_si512((const void *)(xv + 64));
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i b = _mm512_loadu_si512((const void *)(ws + r * rb + p * 32));
                __m512i lo = _mm512_and_si512(b, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
                __m512i wa = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
                __m512i wb = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
#pragma GCC unroll 4
                for (int i = 0; i < N; i++) {
                    dot[r][i] = _mm512_dpbusd_epi32(dot[r][i], wa, xa[i]);
                    dot[r][i] = _mm512_dpbusd_epi32(dot[r][i], wb, xb[i]);
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 sc = Q4X8_FN(set_scales)(wt, (r0 + r) * ng + g0, ng, gstep, gidx);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                __m256i d32 = _mm256_add_epi32(_mm512_castsi512_si256(dot[r][i]),
                                               _mm512_extracti64x4_epi64(dot[r][i], 1));
                __m256 dv = _mm256_loadu_ps(xd + i * ldq + s * 8);
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d32), _mm256_mul_ps(sc, dv),
                                            acc[r][i]);
            }
        }
        if (++in_group == spg) {
            in_group = 0;
            g0 += gstep ? gstep : 1;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum8(acc[r][i]);
}
#endif

/* One block of 8 weight rows (or one row, R == 1) against all n rows of xq: tiles of 4 x 1
 * at one row, 2 x 2 at two or three, 2 x 4 from four (on AVX2 its x vectors do not all fit
 * the 16 registers with the 8 dot products, and are read from L1 as memory operands: a
 * 2048-column matrix in cache, 8 rows, 2 threads, AVX2: 183-196 G multiply-adds/s; a
 * 1 x 8 tile, which unpacks each weight vector once for 8 rows, measured no faster). The
 * block stays in L1 between the tiles; the first tile prefetches the next block. */
AI void Q4X8_FN(rows)(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                      const weight_t *w, const Q4X8_FN(geom_t) *geo, int64_t r, int64_t pf,
                      const int R)
{
    size_t rb = dtype_row_bytes(DTYPE_Q4X8, w->cols);
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;
    for (int i = 0; i < n;) {
        int64_t p = i == 0 ? pf : 0;
        float *yi = y + i * ldy + r;
        const float *qi = xq + i * ldq;
        int left = n - i;
        if (R == 1) {
            int nn = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            if (nn == 4)
                Q4X8_FN(tile)(yi, ldy, qi, ldq, wr, rb, w, geo, r, p, 1, 4);
            else if (nn == 2)
                Q4X8_FN(tile)(yi, ldy, qi, ldq, wr, rb, w, geo, r, p, 1, 2);
            else
                Q4X8_FN(tile)(yi, ldy, qi, ldq, wr, rb, w, geo, r, p, 1, 1);
            i += nn;
        } else if (left >= 4) {
#if Q4X8_VNNI && defined(Q4X8_ZMM)
            if (n > CPU_X8_WIDE_MIN_N) {
                for (int h = 0; h < R; h += 4)
                    Q4X8_FN(tile_z)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p);
                i += 4;
                continue;
            }
#endif
            for (int h = 0; h < R; h += 2)
                Q4X8_FN(tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p, 2, 4);
            i += 4;
        } else if (left >= 2) {
            for (int h = 0; h < R; h += 2)
                Q4X8_FN(tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p, 2, 2);
            i += 2;
        } else {
            for (int h = 0; h < R; h += 4)
                Q4X8_FN(tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p, 4, 1);
            i += 1;
        }
    }
}

/* How far ahead of a row's position the tiles prefetch, in bytes, for n rows of x.
 * Measured on 1 GiB and more of codes (one matmul, 2 threads, from memory): with one row
 * of x and 1 KiB rows (2048 columns), distances that are multiples of 4 KiB stream at
 * 20-21 GB/s and odd multiples of 2 KiB (6, 10, 14 KiB) at 26-27; with several rows, 3 KiB
 * beats 14 by 10-17 % (8 rows: 184 against 150 G multiply-adds/s; the farther lines are
 * evicted from L1 by the x rows before they are used). 4 KiB rows want eight rows (32 KiB)
 * ahead at every n (3 KiB there loses 20 %). */
AI int64_t Q4X8_FN(prefetch_bytes)(size_t rb, int n)
{
    if (rb >= 4096)
        return 8 * (int64_t)rb;
    if (n > 1)
        return 3072;
    int64_t pf = 8 * (int64_t)rb;
    if (pf < 14336)
        pf = 14336;
    if (pf % 4096 == 0)
        pf += 2048;
    return pf;
}

static void Q4X8_FN(gemv)(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                          const weight_t *w, int64_t r0, int64_t r1)
{
    size_t rb = dtype_row_bytes(DTYPE_Q4X8, w->cols);
    int64_t pf = Q4X8_FN(prefetch_bytes)(rb, n);
    const Q4X8_FN(geom_t) geo = Q4X8_FN(geom)(w);
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8)
        Q4X8_FN(rows)(y, ldy, xq, ldq, n, w, &geo, r,
                      (r + 8) * (int64_t)rb + pf <= r1 * (int64_t)rb ? pf : 0, 8);
    for (; r < r1; r++)
        Q4X8_FN(rows)(y, ldy, xq, ldq, n, w, &geo, r, 0, 1);
}

#undef Q4X8_MADD

/* dst[(r - r0) * cols + k] = W[r][k] as f32, for the prefill path: per set and vector p,
 * the low and high nibbles of lane j are columns 8p..8p+3 and 8p+4..8p+7 of block j, so
 * interleaving the two at 4-byte granularity gives each block's eight columns in order. */
__attribute__((unused)) static void Q4X8_FN(rows_to_f32)(float *dst, const weight_t *w,
                                                          int64_t r0, int64_t r1)
{
    int64_t cols = w->cols, ng = cols / w->group;
    size_t rb = dtype_row_bytes(DTYPE_Q4X8, cols);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    /* Where block j's 8 bytes land in the two unpacked vectors (16 bytes per 128-bit half). */
    static const int at[8] = {0, 8, 32, 40, 16, 24, 48, 56};
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        float *d = dst + (r - r0) * cols;
        for (int64_t s = 0; s < cols / Q4X8_SET; s++) {
            __m256 sc[8], ze[8];
            for (int j = 0; j < 8; j++) {
                int64_t g = (s * Q4X8_SET + 32 * j) / w->group;
                sc[j] = _mm256_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
                ze[j] = _mm256_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
            }
            for (int p = 0; p < 4; p++) {
                __m256i b = _mm256_loadu_si256(
                    (const __m256i *)(row + s * Q4X8_SET_BYTES + p * 32));
                __m256i lo = _mm256_and_si256(b, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
                _Alignas(32) uint8_t t[64];
                _mm256_store_si256((__m256i *)t, _mm256_unpacklo_epi32(lo, hi));
                _mm256_store_si256((__m256i *)(t + 32), _mm256_unpackhi_epi32(lo, hi));
                for (int j = 0; j < 8; j++) {
                    __m256 q = _mm256_cvtepi32_ps(
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(t + at[j]))));
                    _mm256_storeu_ps(d + s * Q4X8_SET + 32 * j + 8 * p,
                                     _mm256_mul_ps(_mm256_sub_ps(q, ze[j]), sc[j]));
                }
            }
        }
    }
}
