/* The one fingerprint of a model's weights: what ties an Exit River file and a TIDE router
 * file to the checkpoint they were built from, so that loading either for another model
 * fails instead of computing nonsense. */
#ifndef RIVER_MODEL_FINGERPRINT_H
#define RIVER_MODEL_FINGERPRINT_H

#include "model/model.h"

/* A 128-bit fingerprint of a model, as 32 lowercase hex digits: a hash of its shape
 * configuration and of every tensor's name, dtype, shape and a sample of its bytes (about
 * 2 KB per tensor, so it costs milliseconds even for gigabytes of weights). Two checkpoints
 * with the same weights in the same dtype and layout share it; changing a tensor changes it
 * unless the change avoids every sampled byte. A placed model answers with the fingerprint
 * model_place took from the mapped file; RIVER_ESTATE when it has none. */
int model_fingerprint(const model_t *m, char out[MODEL_FINGERPRINT_LEN]);

#endif
