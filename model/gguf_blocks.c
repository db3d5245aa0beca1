/* ggml block layouts (model/gguf_blocks.h), from the GGUF specification's descriptions:
 *   Q8_0 {f16 d; i8 q[32]}                      value d*q
 *   Q4_0 {f16 d; u8 qs[16]}                     element j low nibble of qs[j], j+16 high;
 *                                               value d*(q-8)
 *   Q4_1 {f16 d, m; u8 qs[16]}                  value d*q + m
 *   Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}           fifth bit of element j in bit j of qh;
 *                                               value d*(q-16)
 *   Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]}        value d*q + m
 *   Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}   8 groups of 32 with 6-bit scale sc and
 *                                               min mn: value d*sc*q - dmin*mn; each 64
 *                                               elements take 32 bytes, low nibbles first
 *   Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}   as Q4_K, fifth bits in qh
 *   Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}     16 groups of 16, value
 *                                               d*sc*(q-32), q 6 bits split over ql/qh
 * The quantizers are River's own: a block's scale from its range (symmetric types: the
 * element of largest magnitude, as in the reference layout's sign convention; the K types:
 * per-group min/max, then the group scales and mins quantized to 6 or 8 bits against the
 * block's largest, with the codes recomputed against the quantized scales). */
#include "model/gguf_blocks.h"

#include <math.h>
#include <string.h>

#include "common/gguf.h"
#include "kernels/half.h"

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static float rdh(const uint8_t *p)
{
    return f16_to_f32(rd16(p));
}

int gguf_block_known(int type)
{
    switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

size_t gguf_block_row_bytes(int type, int64_t n)
{
    int b = ggml_type_block(type);
    return b ? (size_t)(n / b) * ggml_type_block_bytes(type) : 0;
}

/* The 6-bit scale and min of group j of a Q4_K/Q5_K block (12 packed bytes). */
static void k_scale_min(int j, const uint8_t *q, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void k_pack_scales(const int sc[8], const int mn[8], uint8_t *q)
{
    memset(q, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] |= (uint8_t)sc[j];
            q[j + 4] |= (uint8_t)mn[j];
        } else {
            q[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            q[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
}

/* ---- decoding to codes ----
 * Each block type is decoded to unsigned codes (element order) and, per group, a and z with
 * value = (q - z) * a, the form River stores; `exact_z` types have an integer z. */
typedef struct {
    int group;  /* elements per group */
    int groups; /* groups per block */
} grp_t;

static grp_t block_groups(int type)
{
    switch (type) {
    case GGML_TYPE_Q6_K:
        return (grp_t){16, 16};
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
        return (grp_t){32, 8};
    default:
        return (grp_t){32, 1};
    }
}

/* One block: q (block elements), a and z (groups). For the types with a min, a group of
 * scale zero keeps its offset in b (value b), which the callers treat specially. */
static void block_decode(int type, const uint8_t *p, uint8_t *q, float *a, float *b, float *z)
{
    switch (type) {
    case GGML_TYPE_Q8_0:
        a[0] = rdh(p);
        z[0] = 128, b[0] = -128 * a[0];
        for (int j = 0; j < 32; j++)
            q[j] = (uint8_t)((int8_t)p[2 + j] + 128);
        return;
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1: {
        int off = type == GGML_TYPE_Q4_0 ? 2 : 4;
        a[0] = rdh(p);
        if (type == GGML_TYPE_Q4_0) {
            z[0] = 8, b[0] = -8 * a[0];
        } else {
            b[0] = rdh(p + 2);
            z[0] = a[0] != 0 ? -b[0] / a[0] : 0;
        }
        for (int j = 0; j < 16; j++) {
            q[j] = p[off + j] & 0xF;
            q[j + 16] = p[off + j] >> 4;
        }
        return;
    }
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: {
        int hoff = type == GGML_TYPE_Q5_0 ? 2 : 4;
        a[0] = rdh(p);
        if (type == GGML_TYPE_Q5_0) {
            z[0] = 16, b[0] = -16 * a[0];
        } else {
            b[0] = rdh(p + 2);
            z[0] = a[0] != 0 ? -b[0] / a[0] : 0;
        }
        uint32_t qh = (uint32_t)p[hoff] | (uint32_t)p[hoff + 1] << 8 |
                      (uint32_t)p[hoff + 2] << 16 | (uint32_t)p[hoff + 3] << 24;
        const uint8_t *qs = p + hoff + 4;
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)((qs[j] & 0xF) | ((qh >> j) & 1) << 4);
            q[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        }
        return;
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        float d = rdh(p), dmin = rdh(p + 2);
        const uint8_t *sc = p + 4;
        const uint8_t *qh = type == GGML_TYPE_Q5_K ? p + 16 : NULL;
        const uint8_t *qs = p + (type == GGML_TYPE_Q5_K ? 48 : 16);
        for (int g = 0; g < 8; g++) {
            int s, m;
            k_scale_min(g, sc, &s, &m);
            a[g] = d * (float)s;
            b[g] = -dmin * (float)m;
            z[g] = a[g] != 0 ? dmin * (float)m / a[g] : 0;
        }
        for (int c = 0; c < 4; c++) { /* 64 elements: 32 bytes */
            for (int l = 0; l < 32; l++) {
                uint8_t lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
                if (qh) {
                    lo |= (uint8_t)(((qh[l] >> (2 * c)) & 1) << 4);
                    hi |= (uint8_t)(((qh[l] >> (2 * c + 1)) & 1) << 4);
                }
                q[64 * c + l] = lo;
                q[64 * c + 32 + l] = hi;
            }
        }
        return;
    }
    case GGML_TYPE_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = rdh(p + 208);
        for (int g = 0; g < 16; g++) {
            a[g] = d * (float)sc[g];
            z[g] = 32, b[g] = -32 * a[g];
        }
        for (int h = 0; h < 2; h++) { /* 128 elements: 64 bytes of ql, 32 of qh */
            const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
            uint8_t *o = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (uint8_t)((L[l] & 0xF) | ((H[l] >> 0) & 3) << 4);
                o[l + 32] = (uint8_t)((L[l + 32] & 0xF) | ((H[l] >> 2) & 3) << 4);
                o[l + 64] = (uint8_t)((L[l] >> 4) | ((H[l] >> 4) & 3) << 4);
                o[l + 96] = (uint8_t)((L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4);
            }
        }
        return;
    }
    default:
        return;
    }
}

void gguf_block_dequant(int type, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, sizeof *dst * (size_t)n);
        return;
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = type == GGML_TYPE_F16 ? f16_to_f32(rd16(p + 2 * i))
                                           : bf16_to_f32(rd16(p + 2 * i));
        return;
    default:
        break;
    }
    int bk = ggml_type_block(type);
    size_t bb = ggml_type_block_bytes(type);
    grp_t gr = block_groups(type);
    uint8_t q[256];
    float a[16], b[16], z[16];
    for (int64_t blk = 0; blk < n / bk; blk++, p += bb) {
        block_decode(type, p, q, a, b, z);
        float *y = dst + blk * bk;
        int with_min = type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 ||
                       type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K;
        for (int g = 0; g < gr.groups; g++)
            for (int j = 0; j < gr.group; j++) {
                int e = g * gr.group + j;
                /* The layouts' own formulas: d*q + m for those with a min, else d*(q - z). */
                y[e] = with_min ? a[g] * (float)q[e] + b[g] : ((float)q[e] - z[g]) * a[g];
            }
    }
}

int gguf_block_river_type(int type, dtype_t *dt, int *group)
{
    switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
        return 0;
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q4_K:
        *dt = DTYPE_Q4;
        *group = 32;
        return 1;
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q5_K:
        *dt = DTYPE_Q8;
        *group = 32;
        return 1;
    case GGML_TYPE_Q6_K:
        *dt = DTYPE_Q8;
        *group = 16;
        return 1;
    default:
        return -1;
    }
}

void gguf_block_to_river(int type, const void *src, int64_t n, uint8_t *codes,
                         uint16_t *scales, uint16_t *zeros)
{
    dtype_t dt;
    int group;
    if (gguf_block_river_type(type, &dt, &group) != 1)
        return;
    int bk = ggml_type_block(type);
    size_t bb = ggml_type_block_bytes(type);
    grp_t gr = block_groups(type);
    const uint8_t *p = src;
    uint8_t q[256];
    float a[16], b[16], z[16];
    for (int64_t blk = 0; blk < n / bk; blk++, p += bb) {
        block_decode(type, p, q, a, b, z);
        for (int g = 0; g < gr.groups; g++) {
            int64_t gi = blk * gr.groups + g;
            uint8_t *qg = q + g * gr.group;
            float s = a[g], zz = z[g];
            if (s == 0 && b[g] != 0) {
                /* A constant group: codes 1, zero 0, the constant as the scale. */
                s = b[g];
                zz = 0;
                memset(qg, 1, (size_t)gr.group);
            }
            if (zz > 65504.0f)
                zz = 65504.0f;
            if (zz < -65504.0f)
                zz = -65504.0f;
            scales[gi] = f32_to_f16(s);
            zeros[gi] = f32_to_f16(zz);
        }
        int64_t e0 = blk * bk;
        if (dt == DTYPE_Q8) {
            memcpy(codes + e0, q, (size_t)bk);
        } else {
            for (int j = 0; j < bk; j += 2) /* River's Q4: even column in the low nibble */
                codes[(e0 + j) / 2] = (uint8_t)(q[j] | q[j + 1] << 4);
        }
    }
}

/* ---- quantizers ---- */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The element of largest magnitude, with its sign. */
static float signed_max(const float *x, int n)
{
    float m = 0, am = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > am) {
            am = fabsf(x[i]);
            m = x[i];
        }
    return m;
}

static void quant_sym(int type, const float *x, uint8_t *p)
{
    if (type == GGML_TYPE_Q8_0) {
        float am = fabsf(signed_max(x, 32));
        float d = am / 127.0f, id = d != 0 ? 1.0f / d : 0;
        wr16(p, f32_to_f16(d));
        for (int j = 0; j < 32; j++)
            p[2 + j] = (uint8_t)(int8_t)clampi((int)lrintf(x[j] * id), -127, 127);
        return;
    }
    /* Q4_0 / Q5_0: the largest magnitude maps to code 0 (value -2^(bits-1) * d). */
    int half = type == GGML_TYPE_Q4_0 ? 8 : 16, top = 2 * half - 1;
    float mx = signed_max(x, 32);
    float d = mx / (float)-half, id = d != 0 ? 1.0f / d : 0;
    uint16_t dh = f32_to_f16(d);
    wr16(p, dh);
    uint8_t q[32];
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)clampi((int)floorf(x[j] * id + (float)half + 0.5f), 0, top);
    if (type == GGML_TYPE_Q4_0) {
        for (int j = 0; j < 16; j++)
            p[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        return;
    }
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        p[6 + j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        p[2 + k] = (uint8_t)(qh >> (8 * k));
}

static void quant_min(int type, const float *x, uint8_t *p)
{
    int top = type == GGML_TYPE_Q4_1 ? 15 : 31;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    float d = (hi - lo) / (float)top, id = d != 0 ? 1.0f / d : 0;
    wr16(p, f32_to_f16(d));
    wr16(p + 2, f32_to_f16(lo));
    /* Codes against the stored (rounded) min, so the rounding of m does not bias them. */
    float m = f16_to_f32(f32_to_f16(lo));
    uint8_t q[32];
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)clampi((int)lrintf((x[j] - m) * id), 0, top);
    if (type == GGML_TYPE_Q4_1) {
        for (int j = 0; j < 16; j++)
            p[4 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        return;
    }
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        p[8 + j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        p[4 + k] = (uint8_t)(qh >> (8 * k));
}

/* Q4_K / Q5_K: per group of 32 a scale (hi - lo)/top and a min -lo (lo clamped to <= 0, as
 * the layout's mins are subtracted), both then quantized to 6 bits against the block's
 * largest; the codes are recomputed against the quantized pair. */
static void quant_k(int type, const float *x, uint8_t *p)
{
    int top = type == GGML_TYPE_Q4_K ? 15 : 31;
    float gs[8], gm[8], ms = 0, mm = 0;
    for (int g = 0; g < 8; g++) {
        const float *xg = x + 32 * g;
        float lo = 0, hi = xg[0];
        for (int j = 0; j < 32; j++) {
            lo = fminf(lo, xg[j]);
            hi = fmaxf(hi, xg[j]);
        }
        gs[g] = (hi - lo) / (float)top;
        gm[g] = -lo;
        ms = fmaxf(ms, gs[g]);
        mm = fmaxf(mm, gm[g]);
    }
    float d = ms / 63.0f, dmin = mm / 63.0f;
    uint16_t dh = f32_to_f16(d), mh = f32_to_f16(dmin);
    float dq = f16_to_f32(dh), mq = f16_to_f32(mh);
    int sc[8], mn[8];
    for (int g = 0; g < 8; g++) {
        sc[g] = dq != 0 ? clampi((int)lrintf(gs[g] / dq), 0, 63) : 0;
        mn[g] = mq != 0 ? clampi((int)lrintf(gm[g] / mq), 0, 63) : 0;
    }
    wr16(p, dh);
    wr16(p + 2, mh);
    k_pack_scales(sc, mn, p + 4);
    uint8_t q[256];
    for (int g = 0; g < 8; g++) {
        float s = dq * (float)sc[g], off = mq * (float)mn[g];
        float is = s != 0 ? 1.0f / s : 0;
        for (int j = 0; j < 32; j++)
            q[32 * g + j] = (uint8_t)clampi((int)lrintf((x[32 * g + j] + off) * is), 0, top);
    }
    uint8_t *qh = type == GGML_TYPE_Q5_K ? p + 16 : NULL;
    uint8_t *qs = p + (qh ? 48 : 16);
    if (qh)
        memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
            qs[32 * c + l] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
            if (qh)
                qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
        }
}

/* Q6_K: per group of 16 a symmetric scale (largest magnitude / 32, sign kept so that the
 * largest lands on code 0), quantized to int8 against the block's largest. */
static void quant_q6k(const float *x, uint8_t *p)
{
    float gs[16], ms = 0, msv = 0;
    for (int g = 0; g < 16; g++) {
        gs[g] = signed_max(x + 16 * g, 16) / -32.0f;
        if (fabsf(gs[g]) > ms) {
            ms = fabsf(gs[g]);
            msv = gs[g];
        }
    }
    float d = msv / -128.0f;
    uint16_t dh = f32_to_f16(d);
    float dq = f16_to_f32(dh);
    int8_t *sc = (int8_t *)(p + 192);
    uint8_t q[256];
    for (int g = 0; g < 16; g++) {
        sc[g] = (int8_t)(dq != 0 ? clampi((int)lrintf(gs[g] / dq), -128, 127) : 0);
        float s = dq * (float)sc[g], is = s != 0 ? 1.0f / s : 0;
        for (int j = 0; j < 16; j++)
            q[16 * g + j] = (uint8_t)clampi((int)lrintf(x[16 * g + j] * is) + 32, 0, 63);
    }
    wr16(p + 208, dh);
    uint8_t *ql = p, *qh = p + 128;
    memset(qh, 0, 64);
    for (int h = 0; h < 2; h++) {
        uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
        const uint8_t *o = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            L[l] = (uint8_t)((o[l] & 0xF) | (o[l + 64] & 0xF) << 4);
            L[l + 32] = (uint8_t)((o[l + 32] & 0xF) | (o[l + 96] & 0xF) << 4);
            H[l] = (uint8_t)((o[l] >> 4) | (o[l + 32] >> 4) << 2 | (o[l + 64] >> 4) << 4 |
                             (o[l + 96] >> 4) << 6);
        }
    }
}

void gguf_block_quant(int type, const float *src, void *dst, int64_t n)
{
    uint8_t *p = dst;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, sizeof *src * (size_t)n);
        return;
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            wr16(p + 2 * i, type == GGML_TYPE_F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]));
        return;
    default:
        break;
    }
    int bk = ggml_type_block(type);
    size_t bb = ggml_type_block_bytes(type);
    for (int64_t blk = 0; blk < n / bk; blk++, p += bb) {
        const float *x = src + blk * bk;
        switch (type) {
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q5_0:
            quant_sym(type, x, p);
            break;
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_1:
            quant_min(type, x, p);
            break;
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
            quant_k(type, x, p);
            break;
        case GGML_TYPE_Q6_K:
            quant_q6k(x, p);
            break;
        default:
            memset(p, 0, bb);
        }
    }
}
