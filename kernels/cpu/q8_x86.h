/* The Q8 decode kernel with 8-bit activations in 256-bit integer code, included by
 * kernels_avx2.c and kernels_avx512.c, which compile it with their own flags. Before
 * including, define Q8_FN(name) (the names it defines), Q8_VNNI (1: the multiply-adds
 * are vpdpbusd, which needs AVX-512 VNNI with VL; 0: vpmaddubsw + vpmaddwd) and
 * Q8_Q4X8(name) (the names of the Q4X8 kernel of the same flags, q4x8_x86.h, included
 * before: its geometry and its preparation of x, which Q8X8 shares). The includer
 * provides AI, ld8_f16_tail and kernels/cpu/x86_util.h.
 *
 * Which weights: Q8 whose groups are whole blocks of 32 columns (group % 32 == 0) or halves
 * of one (group 16: llama.cpp's Q6_K), in the file's layout, and Q8X8 (below), the layout
 * the backend repacks most of the former into.
 *
 * x is quantized once per call (Q8_FN(prep)) as llama.cpp's q8_0 does: per block of 32
 * columns d = max|x| / 127 and x8 = round(x / d), ties to even. With w = s (q - z) per
 * group and x^ = d x8,
 *     y = sum_blocks s d (q . x8) - sum_groups s z sum_blocks d sum(x8),
 * W x^ exactly up to f32 rounding (tests/test_backend_ops.c holds every level to it).
 *
 * The dot products of a block are exact in 32-bit integers:
 * - with VNNI, vpdpbusd multiplies the unsigned codes by the signed x8 directly (four
 *   products a lane, at most 4 * 255 * 127), and the zero terms use z as it is;
 * - without, the codes are taken as q - 128 (flipping the top bit gives that as int8) and
 *   multiplied by the sign trick: vpmaddubsw(|q - 128|, x8 with the sign of q - 128), whose
 *   16-bit pair sums stay within 2 * 128 * 127 = 32512; the zero terms then use z - 128.
 * Where every zero is one integer z (found by the backend at placement: weight_t.zero_int;
 * 128 for int8 symmetric weights, llama.cpp's q8_0, 16 for its Q5_0), Q8X8 has no zero
 * terms in f32 on either path: each block's sum starts from its sum of x8 times -z (VNNI)
 * or 128 - z (prepared with x: q4x8_x86.h, zfold), which makes it exactly the sum of
 * (q - z) x8 on both, the same bits. Q8 in the file's layout takes the zero terms as
 * s (z - shift) per group without reading the zeros, and none at all on the second path
 * when z is 128.
 *
 * xq row (ldq floats): x8 as cols bytes in column order, then the cols/32 block scales d,
 * then per group sum d * sum(x8) (zero padded to a multiple of 8). */

__attribute__((unused)) static int64_t Q8_FN(prep_floats)(const weight_t *w)
{
    int64_t ng = w->cols / w->group;
    int64_t f = w->cols / 4 + w->cols / 32 + (ng + 7) / 8 * 8;
    return (f + 15) / 16 * 16; /* rows stay 64-byte aligned */
}

__attribute__((unused)) static void Q8_FN(prep)(float *xq, const float *x, int64_t ldx, int n,
                                                const weight_t *w)
{
    int64_t ldq = Q8_FN(prep_floats)(w), cols = w->cols;
    int64_t nb = cols / 32, ng = cols / w->group, bpg = w->group / 32;
    const bool halves = w->group == 16; /* two groups a block */
    for (int i = 0; i < n; i++) {
        const float *xi = x + i * ldx;
        float *qi = xq + i * ldq;
        int8_t *x8 = (int8_t *)qi;
        float *d = qi + cols / 4, *xs = d + nb;
        for (int64_t g = 0; g < (ng + 7) / 8 * 8; g++)
            xs[g] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = xi + b * 32;
            float amax = x86_absmax(xb, 32);
            d[b] = amax / 127.0f;
            x86_pack32(x8 + b * 32, xb, _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f));
            /* The block's sums of codes: vpsadbw of the codes offset to unsigned, one sum
             * per 8 bytes, the first two the block's first half. */
            __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x8 + b * 32)),
                                         _mm256_set1_epi8((char)0x80));
            __m256i sad = _mm256_sad_epu8(u, _mm256_setzero_si256());
            __m128i lo = _mm256_castsi256_si128(sad), hi = _mm256_extracti128_si256(sad, 1);
            int h0 = (int)(_mm_cvtsi128_si64(lo) + _mm_extract_epi64(lo, 1)) - 16 * 128;
            int h1 = (int)(_mm_cvtsi128_si64(hi) + _mm_extract_epi64(hi, 1)) - 16 * 128;
            if (halves) {
                xs[2 * b] = d[b] * (float)h0;
                xs[2 * b + 1] = d[b] * (float)h1;
            } else {
                xs[b / bpg] += d[b] * (float)(h0 + h1);
            }
        }
    }
}

/* acc[r][i] -= s_g (z_g - zshift) xs_i[g] over the groups of weight row r0 + r, eight
 * groups a vector, lane by lane (acc is summed across lanes at the end). With zero_int the
 * zeros are that integer and not read; 128 and zshift 128 leave nothing to do. */
AI void Q8_FN(zero_terms)(__m256 acc[][4], const weight_t *wt, int64_t r0, int64_t ng,
                          const float *xs, int64_t ldq, const int R, const int N)
{
    const float zshift = Q8_VNNI ? 0.0f : 128.0f;
    if (wt->zero_int == 128 && !Q8_VNNI)
        return;
    for (int64_t gb = 0; gb < ng; gb += 8) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 s = ld8_f16_tail(wt->scales + (r0 + r) * ng + gb, ng - gb);
            __m256 sz;
            if (wt->zero_int) {
                sz = _mm256_mul_ps(s, _mm256_set1_ps((float)wt->zero_int - zshift));
            } else {
                __m256 z = ld8_f16_tail(wt->zeros + (r0 + r) * ng + gb, ng - gb);
                sz = _mm256_mul_ps(s, _mm256_sub_ps(z, _mm256_set1_ps(zshift)));
            }
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm256_fnmadd_ps(sz, _mm256_loadu_ps(xs + i * ldq + gb), acc[r][i]);
        }
    }
}

/* R weight rows (from row r0 of wt, rb bytes apart at w) against N rows of xq.
 *
 * Per block of 32 columns: the R x N integer dot products (one vector each), then each is
 * converted and added to its f32 sum scaled by s_r d_i. */
AI void Q8_FN(tile)(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                    size_t rb, const weight_t *wt, int64_t r0, int64_t pf, const int R,
                    const int N)
{
    const int64_t cols = wt->cols, nb = cols / 32;
    const int group = wt->group;
    const int64_t ng = cols / group;
    const int8_t *x8 = (const int8_t *)xq;
    const int64_t ldq8 = ldq * 4;
    const float *xd = xq + cols / 4, *xs = xd + nb;
    __m256 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    Q8_FN(zero_terms)(acc, wt, r0, ng, xs, ldq, R, N);
#if !Q8_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i top = _mm256_set1_epi8((char)0x80);
#endif
    /* Groups of 16 are halves of a block: lanes 0-3 of its dot product (columns 0-15)
     * take the first group's scale, lanes 4-7 the second's. */
    const bool halves = group == 16;
    const int bpg = halves ? 1 : group / 32, gpb = halves ? 2 : 1;
    for (int64_t g8 = 0; g8 < ng; g8 += 8) {
        /* The scales of eight groups, converted at once and kept in L1 (the registers hold
         * the sums), where each block broadcasts its own. */
        _Alignas(32) float scm[8][8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            _mm256_store_ps(scm[r], ld8_f16_tail(wt->scales + (r0 + r) * ng + g8, ng - g8));
        int64_t b1 = (g8 + 8 < ng ? g8 + 8 : ng) * bpg / gpb;
        for (int64_t b = g8 * bpg / gpb; b < b1; b++) {
            int gl = (int)(b * gpb / bpg - g8);
            if (pf && (b & 1) == 0)
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    _mm_prefetch((const char *)(w + r * rb + b * 32 + pf), _MM_HINT_T0);
            __m256i xv[4];
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                xv[i] = _mm256_load_si256((const __m256i *)(x8 + i * ldq8 + b * 32));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(w + r * rb + b * 32));
#if !Q8_VNNI
                __m256i qs = _mm256_xor_si256(q, top); /* q - 128 as int8 */
                __m256i qa = _mm256_abs_epi8(qs);      /* |q - 128|; 128 reads as unsigned */
#endif
                __m256 sr = halves ? _mm256_set_m128(_mm_broadcast_ss(&scm[r][gl + 1]),
                                                     _mm_broadcast_ss(&scm[r][gl]))
                                   : _mm256_broadcast_ss(&scm[r][gl]);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++) {
#if Q8_VNNI
                    __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xv[i]);
#else
                    __m256i dot = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(qa, _mm256_sign_epi8(xv[i], qs)), ones);
#endif
                    __m256 sd = _mm256_mul_ps(sr, _mm256_broadcast_ss(xd + i * ldq + b));
                    acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, acc[r][i]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            y[i * ldy + r] = hsum8(acc[r][i]);
}

/* One block of 8 weight rows (or one row, R == 1) against all n rows of xq: tiles of 8 x 1
 * at one row of x, 4 x 2 at two or three, 2 x 4 from four. The block stays in L1 between
 * the tiles; the first tile prefetches the next block. */
AI void Q8_FN(rows)(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                    const weight_t *w, int64_t r, int64_t pf, const int R)
{
    size_t rb = dtype_row_bytes(DTYPE_Q8, w->cols);
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;
    for (int i = 0; i < n;) {
        int64_t p = i == 0 ? pf : 0;
        float *yi = y + i * ldy + r;
        const float *qi = xq + i * ldq;
        int left = n - i;
        if (R == 1) {
            int nn = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            if (nn == 4)
                Q8_FN(tile)(yi, ldy, qi, ldq, wr, rb, w, r, p, 1, 4);
            else if (nn == 2)
                Q8_FN(tile)(yi, ldy, qi, ldq, wr, rb, w, r, p, 1, 2);
            else
                Q8_FN(tile)(yi, ldy, qi, ldq, wr, rb, w, r, p, 1, 1);
            i += nn;
        } else if (left >= 4) {
            for (int h = 0; h < R; h += 2)
                Q8_FN(tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, r + h, p, 2, 4);
            i += 4;
        } else if (left >= 2) {
            for (int h = 0; h < R; h += 4)
                Q8_FN(tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, r + h, p, 4, 2);
            i += 2;
        } else {
            Q8_FN(tile)(yi, ldy, qi, ldq, wr, rb, w, r, p, 8, 1);
            i += 1;
        }
    }
}

/* Rows r0..r1 in blocks of 8, each prefetching the next block (8 rows ahead). */
static void Q8_FN(gemv)(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                        const weight_t *w, int64_t r0, int64_t r1)
{
    size_t rb = dtype_row_bytes(DTYPE_Q8, w->cols);
    int64_t pf = 8 * (int64_t)rb;
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8)
        Q8_FN(rows)(y, ldy, xq, ldq, n, w, r, r + 16 <= r1 ? pf : 0, 8);
    for (; r < r1; r++)
        Q8_FN(rows)(y, ldy, xq, ldq, n, w, r, 0, 1);
}

/* ---- Q8X8 (q4x8.h): the lanes of a dot product vector are eight different blocks ------ */

/* Groups of 16 columns (llama.cpp's Q6_K): vectors 0-3 of a set hold columns 0-15 of every
 * block, its first group, and vectors 4-7 its second, so the dot products of a set are
 * converted and scaled once a half, lane j with group 2j + h's scale (half_scales), and the
 * second half's sums start again from its folded zero terms. Step h of set s: acc[r][i] +=
 * dot[r][i] s_h d_i. */
AI void Q8_FN(x8_half_step)(__m256 acc[][4], __m256i dot[][4], const weight_t *wt,
                            const float *xd, int64_t ldq, int64_t r0, int64_t ng, int64_t s,
                            int h, const int R, const int N)
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m256 sc = Q8_Q4X8(half_scales)(wt->scales + (r0 + r) * ng + s * 16, h);
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            __m256 dv = _mm256_loadu_ps(xd + i * ldq + s * 8);
            acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][i]), _mm256_mul_ps(sc, dv),
                                        acc[r][i]);
        }
    }
}

/* x is prepared as for Q4X8 (Q8_Q4X8(prep)): per set of 256 columns, vector v lane j byte t
 * holds x8 of column 32j + 4v + t, the order of Q8X8's codes. Per set and (weight row, x
 * row) the eight code vectors go into one int32 vector (lane j: block j's dot product),
 * converted and scaled once: with VNNI one vpdpbusd a vector, else the sign trick and a
 * vpmaddwd (the 16-bit pair sums, up to 32512, leave no room to add two before widening).
 * The dot products live in registers for the set, the f32 sums in memory (as in Q4X8).
 * With halves (groups of 16) the conversion and scaling come once a half instead. */
AI void Q8_FN(x8_tile)(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                       size_t rb, const weight_t *wt, const Q8_Q4X8(geom_t) *geo, int64_t r0,
                       int64_t pf, const int R, const int N, const bool halves)
{
    const int64_t cols = wt->cols, ng = geo->ng, nsets = geo->nsets;
    const int8_t *x8 = (const int8_t *)xq;
    const int64_t ldq8 = ldq * 4;
    const float *xd = xq + cols / 4, *xs = xd + cols / 32;
    const int32_t *xz = (const int32_t *)(xq + Q8_Q4X8(zsums_at)(cols, ng));
    const bool fold = Q8_Q4X8(zfold)(wt) != 0;
    const int64_t zstride = halves ? 16 : 8; /* folded sums a set */
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    if (!fold)
        Q8_FN(zero_terms)(acc, wt, r0, ng, xs, ldq, R, N);
    const __m256i gidx = geo->gidx;
    const int64_t gstep = geo->gstep;
    const int spg = geo->spg;
#if !Q8_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i top = _mm256_set1_epi8((char)0x80);
#endif
    int64_t g0 = 0;
    int in_group = 0;
    for (int64_t s = 0; s < nsets; s++) {
        __asm__ volatile("" : "+m"(acc));
        __m256i dot[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            __m256i z0 = fold ? _mm256_loadu_si256(
                                    (const __m256i *)(xz + i * ldq + s * zstride))
                              : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                dot[r][i] = z0;
        }
        const uint8_t *ws = w + s * Q8X8_SET_BYTES;
        if (pf)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int l = 0; l < 4; l++)
                    _mm_prefetch((const char *)(ws + r * rb + pf + 64 * l), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            if (halves && v == 4) {
                Q8_FN(x8_half_step)(acc, dot, wt, xd, ldq, r0, ng, s, 0, R, N);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++) {
                    __m256i z1 = fold ? _mm256_loadu_si256(
                                            (const __m256i *)(xz + i * ldq + s * 16 + 8))
                                      : _mm256_setzero_si256();
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++)
                        dot[r][i] = z1;
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(ws + r * rb + v * 32));
#if !Q8_VNNI
                __m256i qs = _mm256_xor_si256(q, top);
                __m256i qa = _mm256_abs_epi8(qs);
#endif
#pragma GCC unroll 4
                for (int i = 0; i < N; i++) {
                    __m256i xv = _mm256_load_si256(
                        (const __m256i *)(x8 + i * ldq8 + s * Q4X8_SET + v * 32));
#if Q8_VNNI
                    dot[r][i] = _mm256_dpbusd_epi32(dot[r][i], q, xv);
#else
                    dot[r][i] = _mm256_add_epi32(
                        dot[r][i], _mm256_madd_epi16(
                                       _mm256_maddubs_epi16(qa, _mm256_sign_epi8(xv, qs)), ones));
                    __asm__("" : "+x"(dot[r][i]));
#endif
                }
            }
        }
        if (halves) {
            Q8_FN(x8_half_step)(acc, dot, wt, xd, ldq, r0, ng, s, 1, R, N);
            continue;
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            int64_t off = (r0 + r) * ng + g0, left = wt->rows * ng - off;
            __m256 sc = ld8_f16_tail(wt->scales + off, left < 8 ? left : 8);
            sc = _mm256_permutevar8x32_ps(sc, gidx);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                __m256 dv = _mm256_loadu_ps(xd + i * ldq + s * 8);
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][i]), _mm256_mul_ps(sc, dv),
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

#if Q8_VNNI && defined(Q8_ZMM)
/* x8_half_step from the 4 x 4 dot products of x8_tile_z: each one's two 256-bit halves
 * (block j's even and odd vectors) added first, as that tile does for every set. */
AI void Q8_FN(x8_half_step_z)(__m256 acc[][4], __m512i dot[][4], const weight_t *wt,
                              const float *xd, int64_t ldq, int64_t r0, int64_t ng, int64_t s,
                              int h)
{
    __m256i d[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            d[r][i] = _mm256_add_epi32(_mm512_castsi512_si256(dot[r][i]),
                                       _mm512_extracti64x4_epi64(dot[r][i], 1));
    Q8_FN(x8_half_step)(acc, d, wt, xd, ldq, r0, ng, s, h, 4, 4);
}

/* x8_tile at 4 x 4 with 512-bit vpdpbusd (Q8_ZMM: the includer compiles AVX-512): one load
 * of 64 bytes is vectors v and v + 1 of the set, so lanes 0-7 of the dot product vector
 * add block j's even vectors and lanes 8-15 its odd ones. Their sum, in 32-bit integers,
 * is exactly the 256-bit tile's, and from there the conversion, scaling and f32 sums are
 * its own: every output keeps its bits. It does half the integer instructions a multiply-
 * add, and its 16 dot products reuse each loaded vector four times. */
AI void Q8_FN(x8_tile_z)(float *y, int64_t ldy, const float *xq, int64_t ldq, const uint8_t *w,
                         size_t rb, const weight_t *wt, const Q8_Q4X8(geom_t) *geo, int64_t r0,
                         int64_t pf, const bool halves)
{
    enum { R = 4, N = 4 };
    const int64_t cols = wt->cols, ng = geo->ng, nsets = geo->nsets;
    const int8_t *x8 = (const int8_t *)xq;
    const int64_t ldq8 = ldq * 4;
    const float *xd = xq + cols / 4, *xs = xd + cols / 32;
    const int32_t *xz = (const int32_t *)(xq + Q8_Q4X8(zsums_at)(cols, ng));
    const bool fold = Q8_Q4X8(zfold)(wt) != 0;
    const int64_t zstride = halves ? 16 : 8; /* as in x8_tile: vectors 0-3 (v 0, 1), 4-7 */
    __m256 acc[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < N; i++)
            acc[r][i] = _mm256_setzero_ps();
    if (!fold)
        Q8_FN(zero_terms)(acc, wt, r0, ng, xs, ldq, R, N);
    const __m256i gidx = geo->gidx;
    const int64_t gstep = geo->gstep;
    const int spg = geo->spg;
    int64_t g0 = 0;
    int in_group = 0;
    for (int64_t s = 0; s < nsets; s++) {
        __asm__ volatile("" : "+m"(acc));
        __m512i dot[R][N];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            __m512i z0 = fold ? _mm512_zextsi256_si512(_mm256_loadu_si256(
                                    (const __m256i *)(xz + i * ldq + s * zstride)))
                              : _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                dot[r][i] = z0;
        }
        const uint8_t *ws = w + s * Q8X8_SET_BYTES;
        if (pf)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int l = 0; l < 4; l++)
                    _mm_prefetch((const char *)(ws + r * rb + pf + 64 * l), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            if (halves && v == 2) {
                Q8_FN(x8_half_step_z)(acc, dot, wt, xd, ldq, r0, ng, s, 0);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++) {
                    __m512i z1 = fold ? _mm512_zextsi256_si512(_mm256_loadu_si256(
                                            (const __m256i *)(xz + i * ldq + s * 16 + 8)))
                                      : _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++)
                        dot[r][i] = z1;
                }
            }
            __m512i xv[N];
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                xv[i] = _mm512_loadu_si512(
                    (const void *)(x8 + i * ldq8 + s * Q4X8_SET + v * 64));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i q = _mm512_loadu_si512((const void *)(ws + r * rb + v * 64));
#pragma GCC unroll 4
                for (int i = 0; i < N; i++)
                    dot[r][i] = _mm512_dpbusd_epi32(dot[r][i], q, xv[i]);
            }
        }
        if (halves) {
            Q8_FN(x8_half_step_z)(acc, dot, wt, xd, ldq, r0, ng, s, 1);
            continue;
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 sc = Q8_Q4X8(set_scales)(wt, (r0 + r) * ng + g0, ng, gstep, gidx);
#pragma GCC unroll 4
            for (int i = 0; i < N; i++) {
                __m256i d = _mm256_add_epi32(_mm512_castsi512_si256(dot[r][i]),
                                             _mm512_extracti64x4_epi64(dot[r][i], 1));
                __m256 dv = _mm256_loadu_ps(xd + i * ldq + s * 8);
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(sc, dv),
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

/* Tiles as Q4X8's: 4 x 1 at one row of x, 2 x 2 at two or three, 2 x 4 from four. */
AI void Q8_FN(x8_rows)(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                       const weight_t *w, const Q8_Q4X8(geom_t) *geo, int64_t r, int64_t pf,
                       const int R, const bool halves)
{
    size_t rb = dtype_row_bytes(DTYPE_Q8X8, w->cols);
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;
    for (int i = 0; i < n;) {
        int64_t p = i == 0 ? pf : 0;
        float *yi = y + i * ldy + r;
        const float *qi = xq + i * ldq;
        int left = n - i;
        if (R == 1) {
            int nn = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            if (nn == 4)
                Q8_FN(x8_tile)(yi, ldy, qi, ldq, wr, rb, w, geo, r, p, 1, 4, halves);
            else if (nn == 2)
                Q8_FN(x8_tile)(yi, ldy, qi, ldq, wr, rb, w, geo, r, p, 1, 2, halves);
            else
                Q8_FN(x8_tile)(yi, ldy, qi, ldq, wr, rb, w, geo, r, p, 1, 1, halves);
            i += nn;
        } else if (left >= 4) {
#if Q8_VNNI && defined(Q8_ZMM)
            if (n > CPU_X8_WIDE_MIN_N) {
                for (int h = 0; h < R; h += 4)
                    Q8_FN(x8_tile_z)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p,
                                     halves);
                i += 4;
                continue;
            }
#endif
            for (int h = 0; h < R; h += 2)
                Q8_FN(x8_tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p, 2, 4,
                               halves);
            i += 4;
        } else if (left >= 2) {
            for (int h = 0; h < R; h += 2)
                Q8_FN(x8_tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p, 2, 2,
                               halves);
            i += 2;
        } else {
            for (int h = 0; h < R; h += 4)
                Q8_FN(x8_tile)(yi + h, ldy, qi, ldq, wr + h * rb, rb, w, geo, r + h, p, 4, 1,
                               halves);
            i += 1;
        }
    }
}

static void Q8_FN(x8_gemv)(float *y, int64_t ldy, const float *xq, int64_t ldq, int n,
                           const weight_t *w, int64_t r0, int64_t r1)
{
    size_t rb = dtype_row_bytes(DTYPE_Q8X8, w->cols);
    /* Q4X8's distances (a multiple of 4 KiB streams one row of x slower than one off it;
     * several rows of x want it short), taken for Q8X8 rows as they are. */
    int64_t pf = Q8_Q4X8(prefetch_bytes)(rb, n);
    const Q8_Q4X8(geom_t) geo = Q8_Q4X8(geom)(w);
    /* Groups of 16 get their own instances of the tiles (x8_half_step), so that the
     * others' keep the code they had. */
    const bool halves = w->group == 16;
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8) {
        int64_t p = (r + 8) * (int64_t)rb + pf <= r1 * (int64_t)rb ? pf : 0;
        if (halves)
            Q8_FN(x8_rows)(y, ldy, xq, ldq, n, w, &geo, r, p, 8, true);
        else
            Q8_FN(x8_rows)(y, ldy, xq, ldq, n, w, &geo, r, p, 8, false);
    }
    for (; r < r1; r++)
        Q8_FN(x8_rows)(y, ldy, xq, ldq, n, w, &geo, r, 0, 1, halves);
}

/* dst[(r - r0) * cols + k] = W[r][k] as f32 (the prefill path and embed): each set's codes
 * are put back in column order four bytes at a time, then converted a block at a time. */
__attribute__((unused)) static void Q8_FN(x8_rows_to_f32)(float *dst, const weight_t *w,
                                                          int64_t r0, int64_t r1)
{
    int64_t cols = w->cols, ng = cols / w->group;
    size_t rb = dtype_row_bytes(DTYPE_Q8X8, cols);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        float *d = dst + (r - r0) * cols;
        for (int64_t s = 0; s < cols / Q4X8_SET; s++) {
            _Alignas(32) uint8_t t[Q4X8_SET];
            const uint8_t *in = row + s * Q8X8_SET_BYTES;
            for (int v = 0; v < 8; v++)
                for (int j = 0; j < 8; j++)
                    memcpy(t + 32 * j + 4 * v, in + 32 * v + 4 * j, 4);
            for (int j = 0; j < 8; j++) {
                for (int h = 0; h < 32; h += 8) {
                    /* Eight columns lie in one group (16 columns or more). */
                    int64_t g = (s * Q4X8_SET + 32 * j + h) / w->group;
                    __m256 sc = _mm256_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
                    __m256 ze = _mm256_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
                    __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                        _mm_loadl_epi64((const __m128i *)(t + 32 * j + h))));
                    _mm256_storeu_ps(d + s * Q4X8_SET + 32 * j + h,
                                     _mm256_mul_ps(_mm256_sub_ps(q, ze), sc));
                }
            }
        }
    }
}
