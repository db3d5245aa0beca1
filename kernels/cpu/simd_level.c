/* The CPU's SIMD levels (kernels/cpu/cpu.h): what the processor has, what RIVER_SIMD asks
 * for, and the kernel table of each level. */
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_internal.h"

cpu_simd_t cpu_simd_detect(void)
{
    __builtin_cpu_init();
    /* F16C has no __builtin_cpu_supports name in older compilers: ask CPUID (leaf 1, ECX)
     * directly. Both SIMD levels use it. */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    /* DQ is checked too although the kernels only need F/BW/VL: the AVX-512 file is
     * compiled with -mavx512dq, so the compiler may use DQ instructions there. Every
     * processor with BW and VL has it. */
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        /* AVX512-BF16 is CPUID leaf 7, subleaf 1, EAX bit 5. */
        unsigned a7 = 0, b7, c7, d7;
        if (__get_cpuid_count(7, 1, &a7, &b7, &c7, &d7) && (a7 & (1u << 5)))
            return CPU_SIMD_AVX512BF16;
        return CPU_SIMD_AVX512;
    }
    return avx2 ? CPU_SIMD_AVX2 : CPU_SIMD_SCALAR;
}

const char *cpu_simd_name(cpu_simd_t level)
{
    switch (level) {
    case CPU_SIMD_SCALAR:
        return "scalar";
    case CPU_SIMD_AVX2:
        return "avx2";
    case CPU_SIMD_AVX512:
        return "avx512";
    case CPU_SIMD_AVX512BF16:
        return "avx512bf16";
    case CPU_SIMD_COUNT:
        break;
    }
    return "unknown";
}

cpu_simd_t cpu_simd_parse(const char *name)
{
    for (int l = 0; l < CPU_SIMD_COUNT; l++)
        if (name && !strcmp(name, cpu_simd_name((cpu_simd_t)l)))
            return (cpu_simd_t)l;
    return CPU_SIMD_COUNT;
}

/* RIVER_SIMD, parsed once: the level asked for (CPU_SIMD_COUNT: none) and the text, kept
 * for the error of every later call. */
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static cpu_simd_t simd_env_level;
static char simd_env_text[32];
static int simd_env_set;

static void simd_env_read(void)
{
    const char *v = getenv("RIVER_SIMD");
    simd_env_set = v && *v;
    if (!simd_env_set)
        return;
    snprintf(simd_env_text, sizeof simd_env_text, "%s", v);
    simd_env_level = cpu_simd_parse(v);
}

int cpu_simd_selected(cpu_simd_t *out)
{
    cpu_simd_t best = cpu_simd_detect();
    if (pthread_once(&simd_once, simd_env_read) != 0)
        return river_err_set(RIVER_ESYS, "RIVER_SIMD: pthread_once failed");
    if (!simd_env_set) {
        *out = best;
        return 0;
    }
    if (simd_env_level == CPU_SIMD_COUNT)
        return river_err_set(RIVER_EINVAL, "RIVER_SIMD=%s: not a level (scalar, avx2, "
                             "avx512, avx512bf16); this processor has up to %s",
                             simd_env_text, cpu_simd_name(best));
    if (simd_env_level > best)
        return river_err_set(RIVER_EUNSUPPORTED, "RIVER_SIMD=%s: this processor lacks %s; "
                             "it has up to %s", simd_env_text, simd_env_text,
                             cpu_simd_name(best));
    *out = simd_env_level;
    return 0;
}

const cpu_kernels_t *cpu_kernels_get(cpu_simd_t level)
{
    switch (level) {
    case CPU_SIMD_AVX512BF16:
        return &cpu_kernels_avx512bf16;
    case CPU_SIMD_AVX512:
        return &cpu_kernels_avx512;
    case CPU_SIMD_AVX2:
        return &cpu_kernels_avx2;
    default:
        return &cpu_kernels_scalar;
    }
}
