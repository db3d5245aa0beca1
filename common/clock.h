/* The monotonic clock, read in the units callers keep: seconds as a double for timings
 * and rates, integer milliseconds for deadlines and timeouts, micro- and nanoseconds for
 * latencies and spin loops. CLOCK_MONOTONIC does not jump with the wall clock, and on
 * Linux reading it cannot fail given a valid pointer. */
#ifndef RIVER_COMMON_CLOCK_H
#define RIVER_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline double clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int64_t clock_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t clock_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
