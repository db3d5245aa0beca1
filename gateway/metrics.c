/* The gateway's own Prometheus metrics (GET /metrics): requests by HTTP status, time to
 * first token, token counters and the decode time they took, requests in flight. One lock
 * guards them: each request touches them a few times, not once per token. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gateway.h"

static const int gw_metrics__statuses[] = {200, 400, 401, 404, 405, 413, 429,
                                           500, 502, 503, 504};
#define GW_N_STATUS (sizeof gw_metrics__statuses / sizeof gw_metrics__statuses[0])
/* Time-to-first-token bucket bounds, seconds. */
static const double gw_metrics__ttft_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1,    2.5,   5,    10,  30};
#define GW_N_TTFT (sizeof gw_metrics__ttft_le / sizeof gw_metrics__ttft_le[0])

static struct {
    pthread_mutex_t mu;
    uint64_t by_status[GW_N_STATUS + 1]; /* the last: any other status */
    uint64_t stream_errors;
    uint64_t ttft_buckets[GW_N_TTFT];
    uint64_t ttft_count;
    double ttft_sum;
    uint64_t prompt_tokens, completion_tokens;
    double decode_seconds;
    int in_flight;
} gw_metrics__m = {.mu = PTHREAD_MUTEX_INITIALIZER};

void gw_metrics_request(int status)
{
    size_t i = 0;
    while (i < GW_N_STATUS && gw_metrics__statuses[i] != status)
        i++;
    pthread_mutex_lock(&gw_metrics__m.mu);
    gw_metrics__m.by_status[i]++;
    pthread_mutex_unlock(&gw_metrics__m.mu);
}

void gw_metrics_stream_error(void)
{
    pthread_mutex_lock(&gw_metrics__m.mu);
    gw_metrics__m.stream_errors++;
    pthread_mutex_unlock(&gw_metrics__m.mu);
}

void gw_metrics_first_token(double seconds)
{
    pthread_mutex_lock(&gw_metrics__m.mu);
    for (size_t i = 0; i < GW_N_TTFT; i++)
        if (seconds <= gw_metrics__ttft_le[i])
            gw_metrics__m.ttft_buckets[i]++;
    gw_metrics__m.ttft_count++;
    gw_metrics__m.ttft_sum += seconds;
    pthread_mutex_unlock(&gw_metrics__m.mu);
}

void gw_metrics_tokens(uint32_t prompt_tokens, uint32_t completion_tokens, double decode_s)
{
    pthread_mutex_lock(&gw_metrics__m.mu);
    gw_metrics__m.prompt_tokens += prompt_tokens;
    gw_metrics__m.completion_tokens += completion_tokens;
    gw_metrics__m.decode_seconds += decode_s > 0 ? decode_s : 0;
    pthread_mutex_unlock(&gw_metrics__m.mu);
}

void gw_metrics_in_flight(int delta)
{
    pthread_mutex_lock(&gw_metrics__m.mu);
    gw_metrics__m.in_flight += delta;
    pthread_mutex_unlock(&gw_metrics__m.mu);
}

char *gw_metrics_text(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    pthread_mutex_lock(&gw_metrics__m.mu);
    fprintf(f, "# HELP river_gateway_requests_total HTTP requests answered, by status.\n"
               "# TYPE river_gateway_requests_total counter\n");
    for (size_t i = 0; i < GW_N_STATUS; i++)
        fprintf(f, "river_gateway_requests_total{status=\"%d\"} %llu\n",
                gw_metrics__statuses[i], (unsigned long long)gw_metrics__m.by_status[i]);
    fprintf(f, "river_gateway_requests_total{status=\"other\"} %llu\n",
            (unsigned long long)gw_metrics__m.by_status[GW_N_STATUS]);
    fprintf(f, "# HELP river_gateway_stream_errors_total Streams that ended with an error "
               "chunk.\n# TYPE river_gateway_stream_errors_total counter\n"
               "river_gateway_stream_errors_total %llu\n",
            (unsigned long long)gw_metrics__m.stream_errors);
    fprintf(f, "# HELP river_gateway_time_to_first_token_seconds From the request to its "
               "first token.\n# TYPE river_gateway_time_to_first_token_seconds histogram\n");
    for (size_t i = 0; i < GW_N_TTFT; i++)
        fprintf(f, "river_gateway_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n",
                gw_metrics__ttft_le[i], (unsigned long long)gw_metrics__m.ttft_buckets[i]);
    fprintf(f,
            "river_gateway_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n"
            "river_gateway_time_to_first_token_seconds_sum %.6f\n"
            "river_gateway_time_to_first_token_seconds_count %llu\n",
            (unsigned long long)gw_metrics__m.ttft_count, gw_metrics__m.ttft_sum,
            (unsigned long long)gw_metrics__m.ttft_count);
    fprintf(f,
            "# HELP river_gateway_prompt_tokens_total Prompt tokens of finished requests.\n"
            "# TYPE river_gateway_prompt_tokens_total counter\n"
            "river_gateway_prompt_tokens_total %llu\n"
            "# HELP river_gateway_completion_tokens_total Tokens generated.\n"
            "# TYPE river_gateway_completion_tokens_total counter\n"
            "river_gateway_completion_tokens_total %llu\n"
            "# HELP river_gateway_decode_seconds_total Time from first to last token, summed "
            "over requests: completion tokens / this = decode tokens/s.\n"
            "# TYPE river_gateway_decode_seconds_total counter\n"
            "river_gateway_decode_seconds_total %.6f\n"
            "# HELP river_gateway_requests_in_flight Generation requests running.\n"
            "# TYPE river_gateway_requests_in_flight gauge\n"
            "river_gateway_requests_in_flight %d\n",
            (unsigned long long)gw_metrics__m.prompt_tokens,
            (unsigned long long)gw_metrics__m.completion_tokens, gw_metrics__m.decode_seconds,
            gw_metrics__m.in_flight);
    pthread_mutex_unlock(&gw_metrics__m.mu);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}
