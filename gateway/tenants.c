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
    t->requests = cfg->tenant_requests_per_minute;
    t->tokens = cfg->tenant_tokens_per_minute;
    t->t_last = clock_now_s();
    return t;
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
    double rpm = t->cfg->tenant_requests_per_minute, tpm = t->cfg->tenant_tokens_per_minute;
    t->requests = fmin(rpm, t->requests + dt * rpm / 60);
    t->tokens = fmin(tpm, t->tokens + dt * tpm / 60);
}

int gw_tenant_admit(gw_tenant_t *t, gw_error_t *err)
{
    const gw_config_t *c = t->cfg;
    pthread_mutex_lock(&t->mu);
    gw_tenant__refill(t);
    const char *limit = NULL;
    int value = 0;
    double wait_s = 0;
    if (c->tenant_requests_per_minute && t->requests < 1) {
        limit = "requests_per_minute";
        value = c->tenant_requests_per_minute;
        wait_s = (1 - t->requests) * 60 / value;
    } else if (c->tenant_tokens_per_minute && t->tokens <= 0) {
        limit = "tokens_per_minute";
        value = c->tenant_tokens_per_minute;
        wait_s = (1 - t->tokens) * 60 / value;
    } else if (c->tenant_requests_per_minute) {
        t->requests -= 1;
    }
    pthread_mutex_unlock(&t->mu);
    if (!limit)
        return 0;
    return gw_error_set(err, GW_ERR_RATE, NULL,
                        "tenant '%s' is over its limit tenants.%s (%d); retry in %.0f s",
                        t->name, limit, value, ceil(wait_s));
}

void gw_tenant_charge(gw_tenant_t *t, uint32_t tokens)
{
    if (!t->cfg->tenant_tokens_per_minute)
        return;
    pthread_mutex_lock(&t->mu);
    gw_tenant__refill(t);
    t->tokens -= tokens;
    pthread_mutex_unlock(&t->mu);
}
