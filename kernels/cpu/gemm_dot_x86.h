/* The prefill GEMM of float weights in the decode kernels' order of additions (simd.h:
 * gemm_wpack, gemm_dot), written once for the x86 levels and included by kernels_avx2.c and
 * kernels_avx512.c, which compile it with their own vector width. Before including, define
 * GD_FN(name) (the names it defines), GD_V (the vector type), GD_L (its lanes), GD_MR and
 * GD_NR (the tile: rows of x, weight rows), GD_ZERO(), GD_LOAD(p) (aligned), GD_LOADU(p),
 * GD_STORE(p, v) (aligned), GD_FMA(a, b, c) (a * b + c, rounded once), GD_SUMS(y, v,
 * nr) (y[j] for j < nr becomes the decode kernels' sum of the lanes of v[j], of a row's
 * GD_NR vectors) and GD_LDW(et, p) (GD_L weights of element type et at byte p, as f32).
 * The includer provides AI and kernels/cpu/rowblock.h. A level whose decode kernels take
 * bf16 weights in even/odd order (simd.h: gemm_x_cols_per_float) also defines
 * GD_LDW_EO(p, s): vector s of that order, where p is the byte of the plain order's vector
 * s, counted from a block of 2 GD_L columns; the template then defines gemm_wpack_eo.
 *
 * Why this form: the decode kernels keep one vector of partial sums per output, lane l
 * adding the products of columns l, l + GD_L, l + 2 GD_L, ... in turn, and sum the lanes at
 * the end. Lossless mode and the prefix cache need a prompt row to get those bits whatever
 * path computes it, so this kernel keeps the same vectors (the "dot" form: x rows and weight
 * rows both read along k), carries them between blocks of columns through memory exactly
 * as they are, and sums them with the same reduction at the last block. The outer-product
 * form (a broadcast of x against a vector of weight rows) adds in column order per output
 * instead, which no decode kernel can afford. Both forms do GD_MR * GD_NR multiply-adds for
 * GD_MR + GD_NR loads. */

/* Where the vector of row r (r0 <= r) from column k0 + s * GD_L goes in the panels. */
AI float *GD_FN(gemm_wpack_at)(float *wp, int64_t r0, int64_t kc, int64_t r, int64_t s)
{
    int64_t p = (r - r0) / GD_NR, j = (r - r0) % GD_NR;
    return wp + p * GD_NR * kc + (s * GD_NR + j) * GD_L;
}

#ifdef GD_LDW_EO
#define GD__LDW(et, p, s, eo) ((eo) ? GD_LDW_EO(p, s) : GD_LDW(et, p))
#else
#define GD__LDW(et, p, s, eo) GD_LDW(et, p)
#endif

/* The rows in the order of memory, so that the reads are one stream the prefetchers
 * follow: row by row in the row-major layout, and in the row-blocked one (rowblock.h) a
 * block of rows at a time, a span (one chunk of each of its rows) after another. eo: bf16
 * weights in even/odd order (GD_LDW_EO), k0 a multiple of 2 GD_L. */
AI void GD_FN(gemm_wpack_et)(float *wp, const weight_t *w, int64_t r0, int64_t r1, int64_t k0,
                             int64_t k1, const dtype_t et, const int eo)
{
    size_t rb = dtype_row_bytes(w->dtype, w->cols), es = et == DTYPE_F32 ? 4 : 2;
    int64_t kc = k1 - k0, steps = kc / GD_L;
    if (cpu_rowblock_is(w->dtype)) {
        /* Row-blocked weights have whole blocks of rows, whole chunks of columns, and r0
         * and k0 at the start of both (matmul.c hands out rows by MM_MC and columns by
         * MM_KC). */
        const int per = CPU_ROWBLOCK_CHUNK / (int)es / GD_L; /* vectors a chunk */
        for (int64_t b = r0; b < r1; b += CPU_ROWBLOCK_ROWS) {
            const uint8_t *span = cpu_rowblock_at(w->data, rb, b, (size_t)k0 * es);
            /* As the decode tiles do: the prefetchers start cold at each 4 KiB page. */
            cpu_rowblock_prefetch_pages(cpu_rowblock_at(w->data, rb, b, 0),
                                        CPU_ROWBLOCK_ROWS * rb);
            for (int64_t s = 0; s < steps; s += per, span += CPU_ROWBLOCK_SPAN) {
                _mm_prefetch((const char *)span + 4 * CPU_ROWBLOCK_SPAN, _MM_HINT_T0);
                for (int q = 0; q < CPU_ROWBLOCK_ROWS; q++)
                    for (int v = 0; v < per; v++)
                        GD_STORE(GD_FN(gemm_wpack_at)(wp, r0, kc, b + q, s + v),
                                 GD__LDW(et, span + q * CPU_ROWBLOCK_CHUNK + v * GD_L * es,
                                         s + v, eo));
            }
        }
    } else {
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb + (size_t)k0 * es;
            float *d = GD_FN(gemm_wpack_at)(wp, r0, kc, r, 0);
            for (int64_t s = 0; s < steps; s++)
                GD_STORE(d + s * GD_NR * GD_L, GD__LDW(et, row + s * GD_L * es, s, eo));
        }
    }
    /* The rows that pad the last panel. */
    for (int64_t r = r1; (r - r0) % GD_NR != 0; r++) {
        float *d = GD_FN(gemm_wpack_at)(wp, r0, kc, r, 0);
        for (int64_t s = 0; s < steps; s++)
            GD_STORE(d + s * GD_NR * GD_L, GD_ZERO());
    }
}

/* Weight rows r0..r1 at columns k0..k1 (multiples of GD_L) as f32 panels of GD_NR rows,
 * interleaved a vector at a time: wp[((p * (k1 - k0) / GD_L + s) * GD_NR + j) * GD_L + l] =
 * W[r0 + p * GD_NR + j][k0 + s * GD_L + l], zero past r1. */
__attribute__((unused)) static void GD_FN(gemm_wpack)(float *wp, const weight_t *w, int64_t r0,
                                                      int64_t r1, int64_t k0, int64_t k1)
{
    switch (cpu_rowblock_elem(w->dtype)) {
    case DTYPE_BF16:
        GD_FN(gemm_wpack_et)(wp, w, r0, r1, k0, k1, DTYPE_BF16, 0);
        break;
    case DTYPE_F16:
        GD_FN(gemm_wpack_et)(wp, w, r0, r1, k0, k1, DTYPE_F16, 0);
        break;
    default:
        GD_FN(gemm_wpack_et)(wp, w, r0, r1, k0, k1, DTYPE_F32, 0);
        break;
    }
}

#ifdef GD_LDW_EO
/* gemm_wpack for bf16 weights in even/odd order: vector s of the panels holds, of the block
 * of 2 GD_L columns it falls in, the even columns where s is even and the odd ones where it
 * is odd (k0 a multiple of 2 GD_L). */
__attribute__((unused)) static void GD_FN(gemm_wpack_eo)(float *wp, const weight_t *w,
                                                         int64_t r0, int64_t r1, int64_t k0,
                                                         int64_t k1)
{
    GD_FN(gemm_wpack_et)(wp, w, r0, r1, k0, k1, DTYPE_BF16, 1);
}
#endif

/* M rows of x (M <= GD_MR) against one panel: acc[i][j] is output (i, j)'s vector of
 * partial sums, from zero or from the carry c, back to c or, at the last block, summed into
 * y. Every row of the panel is computed (a padded one is zeros); only nr reach y. */
AI void GD_FN(gemm_dot_tile)(float *c, float *y, int64_t ldy, const float *x, int64_t ldx,
                             const float *wp, int nr, int64_t kc, int first, const int M)
{
    GD_V acc[GD_MR][GD_NR];
#pragma GCC unroll 4
    for (int i = 0; i < M; i++)
#pragma GCC unroll 16
        for (int j = 0; j < GD_NR; j++)
            acc[i][j] = first ? GD_ZERO() : GD_LOAD(c + (i * GD_NR + j) * GD_L);
    for (int64_t k = 0; k < kc; k += GD_L, wp += GD_NR * GD_L) {
        GD_V xv[GD_MR];
#pragma GCC unroll 4
        for (int i = 0; i < M; i++) {
            /* The next tile's rows, which come from L2: each tile is a short run of every
             * stream, too short for the hardware prefetchers (river bench --kernels, bf16
             * at 512 rows, AVX2: 74 G multiply-adds/s without, 80 with). */
            _mm_prefetch((const char *)(x + (M + i) * ldx + k), _MM_HINT_T0);
            xv[i] = GD_LOADU(x + i * ldx + k);
        }
#pragma GCC unroll 16
        for (int j = 0; j < GD_NR; j++) {
            /* Loaded once into a register: the compiler would otherwise fold the load into
             * every multiply-add that uses it, M loads where one does, and the loads, not
             * the multiply-adds, would set the pace. Unaligned, since a level may read
             * row-blocked weights where they are (simd.h: gemm_w_in_place). */
            GD_V wv = GD_LOADU(wp + j * GD_L);
            __asm__("" : "+v"(wv));
#pragma GCC unroll 4
            for (int i = 0; i < M; i++)
                acc[i][j] = GD_FMA(wv, xv[i], acc[i][j]);
        }
    }
    if (!y) {
#pragma GCC unroll 4
        for (int i = 0; i < M; i++)
#pragma GCC unroll 16
            for (int j = 0; j < GD_NR; j++)
                GD_STORE(c + (i * GD_NR + j) * GD_L, acc[i][j]);
        return;
    }
#pragma GCC unroll 4
    for (int i = 0; i < M; i++)
        GD_SUMS(y + i * ldy, acc[i], nr);
}

/* m rows of x, a tile of GD_MR at a time (the carry's tiles one after another), against
 * one panel. */
__attribute__((unused)) static void GD_FN(gemm_dot)(float *c, float *y, int64_t ldy,
                                                    const float *x, int64_t ldx, int m,
                                                    const float *wp, int nr, int64_t kc,
                                                    int first)
{
    _Static_assert(GD_MR >= 1 && GD_MR <= 4, "gemm_dot tiles of one to four rows of x");
    _Static_assert(GD_NR >= 1 && GD_NR <= 16, "gemm_dot_tile unrolls up to 16 weight rows");
#define GD_TILE(M)                                                                           \
    GD_FN(gemm_dot_tile)(c, y ? y + i * ldy : NULL, ldy, x + i * ldx, ldx, wp, nr, kc, first, M)
    int i = 0;
    for (; i + GD_MR <= m; i += GD_MR, c += GD_MR * GD_NR * GD_L)
        GD_TILE(GD_MR);
    switch (m - i) {
    case 1: GD_TILE(1); break;
#if GD_MR > 2
    case 2: GD_TILE(2); break;
#endif
#if GD_MR > 3
    case 3: GD_TILE(3); break;
#endif
    default: break;
    }
#undef GD_TILE
}

#undef GD__LDW
