#include "engine/spec_ngram.h"

#include <string.h>

int spec_ngram_draft(const int32_t *ids, size_t n_ids, int n_min, int n_max, int lim,
                     int32_t *out)
{
    if (lim <= 0 || n_min < 1 || n_max < n_min)
        return 0;
    for (int n = n_max; n >= n_min; n--) {
        if ((size_t)n >= n_ids)
            continue;
        const int32_t *suffix = ids + n_ids - (size_t)n;
        /* An occurrence ending at `end` (exclusive) before the suffix itself; the most
         * recent one follows the sequence's latest pattern. */
        for (size_t end = n_ids - 1; end >= (size_t)n; end--) {
            if (memcmp(ids + end - (size_t)n, suffix, (size_t)n * sizeof *ids))
                continue;
            size_t avail = n_ids - end;
            int m = avail < (size_t)lim ? (int)avail : lim;
            memcpy(out, ids + end, (size_t)m * sizeof *ids);
            return m;
        }
    }
    return 0;
}
