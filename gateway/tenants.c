/* Tenants: the request and token rates of one API key's tenant, as two token buckets
 * that refill continuously (a minute's worth at most), so a tenant may burst up to its
 * per-minute limit and then goes at the limit's pace. A request takes one request token
 * at admission and is refused while the token bucket is empty; the tokens it used are
 * taken when it ends, which may leave the bucket below zero, so one large request delays
 * the tenant's next ones instead of being cut short. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "gateway/gateway.h"

struct gw_tenant {
    char name[GW_TENANT_NAME_MAX + 1];
    const gw_config_t *cfg;
    int rpm, tpm;        /* its requests and tokens a minute, 0: no limit */
    int own_rpm, own_tpm; /* the key file set them, not tenants.* */
    pthread_mutex_t mu;
    double requests; /* request tokens left, at most tenants.requests_per_minute */
    double tokens;   /* token-rate tokens left, at most tenants.tokens_per_minute */
    double t_last;   /* monotonic seconds of the last refill */
};

gw_tenant_t *gw_tenant_new(const char *name, const gw_config_t *cfg)
{
    gw_tenant_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (pthread_mutex_init(&t->mu, NULL)) {
        free(t);
        return NULL;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    t->cfg = cfg;
    t->rpm = cfg->tenant_requests_per_minute;
    t->tpm = cfg->tenant_tokens_per_minute;
    t->requests = t->rpm;
    t->tokens = t->tpm;
    t->t_last = clock_now_s();
    return t;
}

void gw_tenant_set_limits(gw_tenant_t *t, int requests_per_minute, int tokens_per_minute)
{
    pthread_mutex_lock(&t->mu);
    if (requests_per_minute >= 0) {
        t->rpm = requests_per_minute;
        t->requests = t->rpm;
        t->own_rpm = 1;
    }
    if (tokens_per_minute >= 0) {
        t->tpm = tokens_per_minute;
        t->tokens = t->tpm;
        t->own_tpm = 1;
    }
    pthread_mutex_unlock(&t->mu);
}

void gw_tenant_destroy(gw_tenant_t **pt)
{
    gw_tenant_t *t = *pt;
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t);
    *pt = NULL;
}

const char *gw_tenant_name(const gw_tenant_t *t)
{
    return t->name;
}

const char *gw_tenant_cache_salt(const gw_tenant_t *t)
{
    return t->cfg->tenant_share_cache ? "" : t->name;
}

bool gw_tenant_cache_shared(const gw_tenant_t *t)
{
    return t->cfg->tenant_share_cache;
}

/* Adds what the time since the last refill earns (caller holds the lock). */
static void gw_tenant__refill(gw_tenant_t *t)
{
    double now = clock_now_s(), dt = now - t->t_last;
    t->t_last = now;
    double rpm = t->rpm, tpm = t->tpm;
    t->requests = fmin(rpm, t->requests + dt * rpm / 60);
    t->tokens = fmin(tpm, t->tokens + dt * tpm / 60);
}

int gw_tenant_admit(gw_tenant_t *t, gw_error_t *err)
{
    pthread_mutex_lock(&t->mu);
    gw_tenant__refill(t);
    const char *limit = NULL;
    int value = 0, own = 0;
    double wait_s = 0;
    if (t->rpm && t->requests < 1) {
        limit = "requests_per_minute";
        value = t->rpm;
        own = t->own_rpm;
        wait_s = (1 - t->requests) * 60 / value;
    } else if (t->tpm && t->tokens <= 0) {
        limit = "tokens_per_minute";
        value = t->tpm;
        own = t->own_tpm;
        wait_s = (1 - t->tokens) * 60 / value;
    } else if (t->rpm) {
        t->requests -= 1;
    }
    pthread_mutex_unlock(&t->mu);
    if (!limit)
        return 0;
    return gw_error_set(err, GW_ERR_RATE, NULL,
                        "tenant '%s' is over its limit %s%s (%d%s); retry in %.0f s", t->name,
                        own ? "" : "tenants.", limit, value, own ? ", its api_keys line" : "",
                        ceil(wait_s));
}

void gw_tenant_charge(gw_tenant_t *t, uint32_t tokens)
{
    pthread_mutex_lock(&t->mu);
    if (!t->tpm) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    gw_tenant__refill(t);
    t->tokens -= tokens;
    pthread_mutex_unlock(&t->mu);
}
