/* The compute peak's rounds (simd.h: peak_f32, peak_i8), written once for every level and
 * type, included by the level files. PEAK_ROUNDS(T, iters, INIT, STEP, FOLD) runs `iters`
 * rounds of PEAK_CHAINS independent chains of type T held in registers: chain i starts at
 * INIT(i) and each round becomes STEP(chain), a multiply-add (a macro of its argument, free to
 * use the caller's constants); the chains are then folded into one value with FOLD(a, b), so
 * that none is dead. Twelve chains cover the latency of two multiply-add units of four or
 * five cycles (ten are needed) and leave registers for the constants. */
#ifndef RIVER_KERNELS_CPU_PEAK_ROUNDS_H
#define RIVER_KERNELS_CPU_PEAK_ROUNDS_H

#define PEAK_CHAINS 12

/* The peak functions, which touch no memory but their own chains, are built without the
 * sanitizers: instrumented, the chains' array stays on the stack and every round loads,
 * checks and stores it, so the sanitizer build timed its stores, not its arithmetic (AVX2 at
 * 1.2-1.8x the portable level instead of about 9x). */
#define PEAK_FN __attribute__((no_sanitize("address", "undefined")))

#define PEAK_ROUNDS(T, iters, INIT, STEP, FOLD)                                              \
    __extension__({                                                                          \
        T peak_a_[PEAK_CHAINS];                                                              \
        _Pragma("GCC unroll 12") for (int peak_i_ = 0; peak_i_ < PEAK_CHAINS; peak_i_++)     \
            peak_a_[peak_i_] = INIT(peak_i_);                                                \
        for (int64_t peak_n_ = 0; peak_n_ < (iters); peak_n_++)                              \
            _Pragma("GCC unroll 12") for (int peak_i_ = 0; peak_i_ < PEAK_CHAINS; peak_i_++) \
                peak_a_[peak_i_] = STEP(peak_a_[peak_i_]);                                   \
        T peak_s_ = peak_a_[0];                                                              \
        _Pragma("GCC unroll 12") for (int peak_i_ = 1; peak_i_ < PEAK_CHAINS; peak_i_++)     \
            peak_s_ = FOLD(peak_s_, peak_a_[peak_i_]);                                       \
        peak_s_;                                                                             \
    })

#endif
