/* Rotary frequencies from a model's configuration, scaling rules included, computed in
 * float32 in the same order as the reference implementations so positions rotate by
 * bit-identical angles. */
#include <math.h>
#include <stdlib.h>

#include "common/err.h"
#include "engine/forward.h"

/* Llama 3.1 "llama3" scaling: long wavelengths are divided by factor, short ones kept, and
 * the band between blends the two (transformers' _compute_llama3_parameters). */
static float rope__llama3(float inv_freq, const model_config_t *cfg)
{
    const float pi = 3.14159265358979323846f;
    float old_ctx = (float)cfg->rope_orig_max_pos;
    float low_wavelen = old_ctx / cfg->rope_low_freq_factor;
    float high_wavelen = old_ctx / cfg->rope_high_freq_factor;
    float wavelen = 2.0f * pi / inv_freq;
    if (wavelen < high_wavelen)
        return inv_freq;
    if (wavelen > low_wavelen)
        return inv_freq / cfg->rope_factor;
    float smooth = (old_ctx / wavelen - cfg->rope_low_freq_factor) /
                   (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
    return (1.0f - smooth) * inv_freq / cfg->rope_factor + smooth * inv_freq;
}

int rope_build(rope_t *rope, const model_config_t *cfg)
{
    int rot = (int)((float)cfg->head_dim * cfg->partial_rotary_factor);
    rot &= ~1;
    if (rot <= 0 || rot > cfg->head_dim)
        return river_err_set(RIVER_EINVAL, "rope: rotary dim %d of head_dim %d", rot,
                             cfg->head_dim);
    float *inv = malloc(sizeof *inv * (size_t)(rot / 2));
    if (!inv)
        return river_err_set(RIVER_ENOMEM, "rope: %d frequencies", rot / 2);
    rope->attn_factor = 1.0f;
    for (int i = 0; i < rot / 2; i++) {
        float f = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)rot);
        switch (cfg->rope_scaling) {
        case ROPE_SCALING_LLAMA3:
            f = rope__llama3(f, cfg);
            break;
        case ROPE_SCALING_LINEAR:
            f /= cfg->rope_factor;
            break;
        case ROPE_SCALING_LONGROPE:
            /* Contexts up to the original window use the short factors, as transformers
             * does for sequences that fit it. */
            if (cfg->rope_short_factor)
                f = 1.0f / (cfg->rope_short_factor[i] *
                            powf(cfg->rope_theta, (float)(2 * i) / (float)rot));
            break;
        case ROPE_SCALING_NONE:
            break;
        }
        inv[i] = f;
    }
    if (cfg->rope_scaling == ROPE_SCALING_LONGROPE && cfg->rope_orig_max_pos > 0) {
        float scale = (float)cfg->max_seq_len / (float)cfg->rope_orig_max_pos;
        if (cfg->rope_factor > 1.0f)
            scale = cfg->rope_factor;
        if (scale > 1.0f)
            rope->attn_factor =
                sqrtf(1.0f + logf(scale) / logf((float)cfg->rope_orig_max_pos));
    }
    rope->layout = cfg->rope_layout;
    rope->head_dim = cfg->head_dim;
    rope->rot_dim = rot;
    rope->inv_freq = inv;
    return 0;
}
