/* The choice of integer kernels for Q4X8 and Q8X8 at the AVX-512 level (x8_pick.h). */
#include "kernels/cpu/x8_pick.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

static const cpu_kernels_t *pick_q4x8, *pick_q8x8;
/* Q4X8 past CPU_X8_WIDE_MIN_N rows of x. */
static const cpu_kernels_t *pick_q4x8_wide;
static pthread_once_t pick_once = PTHREAD_ONCE_INIT;
static int env_bad;
static char env_text[32];

static void pick_init(void)
{
    pick_q4x8 = pick_q8x8 = &cpu_kernels_avx512;
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd"))
        pick_q4x8 = &cpu_kernels_avx2;
    pick_q4x8_wide = __builtin_cpu_supports("avx512vnni") ? &cpu_kernels_avx512 : pick_q4x8;
    const char *v = getenv("RIVER_X8_LEVEL");
    if (!v || !*v)
        return;
    snprintf(env_text, sizeof env_text, "%s", v);
    if (!strcmp(v, "avx2"))
        pick_q4x8 = pick_q8x8 = &cpu_kernels_avx2;
    else if (!strcmp(v, "avx512"))
        pick_q4x8 = pick_q8x8 = &cpu_kernels_avx512;
    else
        env_bad = 1;
    pick_q4x8_wide = pick_q4x8;
}

int cpu_x8_env_check(void)
{
    if (pthread_once(&pick_once, pick_init) != 0)
        return river_err_set(RIVER_ESYS, "RIVER_X8_LEVEL: pthread_once failed");
    if (env_bad)
        return river_err_set(RIVER_EINVAL, "RIVER_X8_LEVEL=%s: not avx2 or avx512 (the level "
                             "whose integer kernels run 4-bit and 8-bit weights at the "
                             "AVX-512 level; unset: the faster for this processor)", env_text);
    return 0;
}

const cpu_kernels_t *cpu_x8_kernels(const cpu_kernels_t *k, const weight_t *w, int n)
{
    dtype_t dt = w->dtype;
    if (k->level != CPU_SIMD_AVX512 || (dt != DTYPE_Q4X8 && dt != DTYPE_Q8X8))
        return k;
    /* pthread_once fails only on misuse; the choice is then made by this thread. */
    if (pthread_once(&pick_once, pick_init) != 0)
        pick_init();
    if (dt == DTYPE_Q4X8)
        return n > CPU_X8_WIDE_MIN_N ? pick_q4x8_wide : pick_q4x8;
    /* Q8X8 at one row of x with every zero one integer: Q4X8's choice (x8_pick.h). */
    return n == 1 && w->zero_int ? pick_q4x8 : pick_q8x8;
}
