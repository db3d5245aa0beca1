/* The vector helpers of the router math (engine/router.c's scoring, offline/router_train.c's
 * gradient), written once so that both run the same lanes in the same order; not public. */
#ifndef RIVER_ENGINE_ROUTER_VEC_H
#define RIVER_ENGINE_ROUTER_VEC_H

#include <string.h>

/* The hot loops are written with GCC vector types, 8 floats wide, so that they vectorise at
 * -O2 whatever the cost model, and the two functions that run them are compiled for several
 * x86 levels and picked at load time (target_clones): AVX-512 or AVX2 where the processor
 * has them, SSE2 otherwise. The helpers are always inlined into those clones. Every clone
 * adds the same lanes in the same order (ISO C mode contracts no FMAs), so all of them give
 * bit-identical results. */
typedef float router_vf __attribute__((vector_size(32)));
#define ROUTER_INLINE static inline __attribute__((always_inline))
/* ThreadSanitizer's runtime is not up yet when the dynamic loader runs ifunc resolvers, and
 * an instrumented resolver crashes there: a TSan build gets the default clone only. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define ROUTER_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ROUTER_CLONES
#endif

/* Unaligned loads and stores through memcpy (a macro: a function returning a 32-byte vector
 * would change the ABI between the clones). */
#define ROUTER_LD(v, p) memcpy(&(v), (p), sizeof(v))
#define ROUTER_ST(p, v) memcpy((p), &(v), sizeof(v))

/* sum a[i]*b[i]*c[i] (c may be NULL). */
ROUTER_INLINE float router__dot3(const float *restrict a, const float *restrict b,
                                 const float *restrict c, int n)
{
    router_vf acc = {0}, va, vb, vc;
    int i = 0;
    if (c) {
        for (; i + 8 <= n; i += 8) {
            ROUTER_LD(va, a + i);
            ROUTER_LD(vb, b + i);
            ROUTER_LD(vc, c + i);
            acc += va * (vb * vc);
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            ROUTER_LD(va, a + i);
            ROUTER_LD(vb, b + i);
            acc += va * vb;
        }
    }
    float s = 0;
    for (; i < n; i++)
        s += a[i] * b[i] * (c ? c[i] : 1.0f);
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

ROUTER_INLINE void router__axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    router_vf vy, vx;
    for (; i + 8 <= n; i += 8) {
        ROUTER_LD(vy, y + i);
        ROUTER_LD(vx, x + i);
        vy += a * vx;
        ROUTER_ST(y + i, vy);
    }
    for (; i < n; i++)
        y[i] += a * x[i];
}

#endif
