/* river-soak: holds N concurrent streaming requests against riverd for a while and says
 * whether any was lost.
 *
 *     river-soak [--endpoint E] [--admin E] [--streams N] [--minutes M | --seconds S]
 *                [--clients K] [--pid RIVERD_PID] [--workers W] [--warmup S]
 *                [--warmup-requests N] [--max-tokens N] [--timeout S] [--grace S]
 *                [--report-every S] [--key F --server-key F]
 *
 * Each stream is one request in flight at all times: when a request ends, its stream
 * submits the next at once. The streams are spread over K client connections (the client
 * library, one thread and one poll loop each), so that riverd also sees several clients.
 * A request is
 *   completed  when it ended with a Final whose chunks were numbered 0, 1, 2... without a
 *              repeat or a gap and carried exactly the completion_tokens the Final counts;
 *   failed     when riverd ended it with an Error (counted by code);
 *   lost       otherwise: a Final whose stream repeated or skipped, riverd silent about it
 *              for --timeout seconds (the library then gives up on it), or still running
 *              --grace seconds after the end.
 * lost = started - completed - failed, and the exit status is 1 when it is not 0.
 *
 * The report also gives the end-to-end latency and time to first token (p50, p99) of the
 * completed requests, tokens per second while every stream ran, and the resident memory
 * (VmRSS) of riverd and of each of its child processes (the local workers) at the end of
 * the warm-up and at the end, with the growth, and the range riverd's took after the
 * warm-up (sampled every 5 s).
 *
 * The warm-up lasts --warmup seconds and until every client connection has had
 * --warmup-requests requests end (at most half the run): riverd's memory reaches its
 * steady state only then. Each ZMQ connection queues its messages in chunks of 256
 * (libzmq's pipe granularity, 16 KB a chunk) and keeps a spare chunk once its queue has
 * wrapped once, touching a chunk's pages as it goes; a connection that carries one
 * request a second crosses its first 256 messages after four minutes and its second 256
 * after eight, adding some 16-32 KB per connection over that time, which with hundreds of
 * connections is megabytes and no leak. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/river_client.h"
#include "common/clock.h"
#include "common/err.h"

#define SOAK_ENDPOINT_DEFAULT "tcp://127.0.0.1:5555"
#define SOAK_ADMIN_DEFAULT "tcp://127.0.0.1:5557"
#define SOAK_MAX_PROCS 64
#define SOAK_CODES 8
#define SOAK_FINISHES 6
/* The message the client library puts in the error it makes when riverd stays silent
 * about a request for its timeout (client/river_client.c). */
#define SOAK_SILENT_PREFIX "no reply from riverd"
/* How often riverd's VmRSS is sampled after the warm-up, for its range. */
#define SOAK_RSS_EVERY_US 5000000

/* ---- Options and shared state ---- */

typedef struct soak_opts {
    const char *endpoint, *admin;
    river_keys_t keys; /* CURVE keys for the client and admin connections; none: plain */
    int streams, clients, workers;
    int64_t run_ms, warmup_ms, timeout_ms, grace_ms, report_ms;
    int64_t warmup_requests; /* per client connection, before the start memory is taken */
    uint32_t max_tokens;
    pid_t riverd_pid;
} soak_opts_t;

typedef enum {
    SOAK_RUN = 0, /* streams submit */
    SOAK_DRAIN,   /* no new requests; wait for the running ones */
    SOAK_DONE,    /* stop; what still runs is lost */
} soak_phase_t;

/* Counters every client thread adds to; the main thread reads them for progress. */
typedef struct soak_counts {
    atomic_uint_fast64_t started, completed, failed, submit_errors;
    atomic_uint_fast64_t lost_silent, lost_sequence, lost_count;
    atomic_uint_fast64_t codes[SOAK_CODES];
    atomic_uint_fast64_t finishes[SOAK_FINISHES];
    atomic_uint_fast64_t tokens;
} soak_counts_t;

static soak_counts_t soak_counts;
static atomic_int soak_phase = SOAK_RUN;
static volatile sig_atomic_t soak_interrupted;

/* A growable array of latencies in milliseconds, owned by one thread. */
typedef struct soak_series {
    double *v;
    size_t n, cap;
} soak_series_t;

struct soak_client;

/* One stream: one request in flight at a time. */
typedef struct soak_stream {
    struct soak_client *owner;
    int index;
    bool busy;
    uint64_t serial;          /* requests this stream started */
    char rid[RIVER_CLIENT_ID_MAX];
    int64_t submit_us, first_us;
    uint64_t next_seq, tokens;
    bool bad_sequence;
} soak_stream_t;

/* One client connection, its thread and its streams. */
typedef struct soak_client {
    const soak_opts_t *o;
    int index;
    river_client_t *c;
    soak_stream_t *streams;
    int n_streams;
    pthread_t thread;
    soak_series_t e2e, ttft;  /* completed requests only */
    int unfinished;           /* busy when the run stopped: lost */
    int err;                  /* a library failure that ended the thread */
    char why[256];
    atomic_int finished;      /* the thread has returned its streams' state */
    atomic_uint_fast64_t ended; /* requests of this connection that ended, any way */
} soak_client_t;

static const char *const soak_prompts[] = {
    "Once upon a time",
    "Tom and Lily went to the park",
    "One day, a little bird",
    "The sun was shining and",
    "Sara had a big red ball",
    "There was a dog named Max",
    "In a small house near the woods",
    "Ben wanted to build a tower",
};

static int soak_series_add(soak_series_t *s, double v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        double *p = realloc(s->v, cap * sizeof *p);
        if (!p)
            return river_err_set(RIVER_ENOMEM, "latency samples");
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    return 0;
}

/* ---- The client threads ---- */

static void soak_on_event(void *user, const river_event_t *ev)
{
    soak_stream_t *st = user;
    soak_client_t *cl = st->owner;
    /* An event of a request this stream no longer waits for cannot happen (the library
     * ends a request once), but a stale one must not touch the current one. */
    if (!st->busy || strcmp(ev->request_id, st->rid) != 0)
        return;
    int64_t now = clock_now_us();
    switch (ev->kind) {
    case RIVER_EVENT_CHUNK:
        if (ev->seq != st->next_seq)
            st->bad_sequence = true;
        st->next_seq = ev->seq + 1;
        st->tokens += ev->n_ids;
        atomic_fetch_add(&soak_counts.tokens, ev->n_ids);
        if (!st->first_us && ev->n_ids > 0)
            st->first_us = now;
        return;
    case RIVER_EVENT_FINAL:
        st->busy = false;
        atomic_fetch_add(&cl->ended, 1);
        if (st->bad_sequence) {
            atomic_fetch_add(&soak_counts.lost_sequence, 1);
            return;
        }
        if (st->tokens != ev->completion_tokens) {
            atomic_fetch_add(&soak_counts.lost_count, 1);
            return;
        }
        atomic_fetch_add(&soak_counts.completed, 1);
        atomic_fetch_add(&soak_counts.finishes[(unsigned)ev->finish < SOAK_FINISHES
                                                   ? ev->finish
                                                   : 0],
                         1);
        if (!cl->err && soak_series_add(&cl->e2e, (double)(now - st->submit_us) / 1000.0) < 0)
            cl->err = RIVER_ENOMEM;
        if (!cl->err && st->first_us &&
            soak_series_add(&cl->ttft, (double)(st->first_us - st->submit_us) / 1000.0) < 0)
            cl->err = RIVER_ENOMEM;
        return;
    case RIVER_EVENT_ERROR:
        st->busy = false;
        atomic_fetch_add(&cl->ended, 1);
        if (ev->code == RIVER_CODE_DEADLINE_EXCEEDED && ev->message &&
            !strncmp(ev->message, SOAK_SILENT_PREFIX, strlen(SOAK_SILENT_PREFIX))) {
            atomic_fetch_add(&soak_counts.lost_silent, 1);
            return;
        }
        atomic_fetch_add(&soak_counts.failed, 1);
        atomic_fetch_add(&soak_counts.codes[(unsigned)ev->code < SOAK_CODES ? ev->code
                                                                           : RIVER_CODE_INTERNAL],
                         1);
        return;
    }
}

/* A small generator per stream, so that the requests vary in prompt and length but a
 * run can be repeated. */
static uint32_t soak_mix(uint64_t a, uint64_t b)
{
    uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint32_t)x;
}

static int soak_submit(soak_client_t *cl, soak_stream_t *st)
{
    const soak_opts_t *o = cl->o;
    uint32_t r = soak_mix((uint64_t)st->index, st->serial);
    river_generate_opts_t g = RIVER_GENERATE_OPTS_INIT;
    g.prompt = soak_prompts[r % (sizeof soak_prompts / sizeof soak_prompts[0])];
    uint32_t lo = o->max_tokens / 4 ? o->max_tokens / 4 : 1;
    g.max_tokens = lo + (r >> 8) % (o->max_tokens - lo + 1);
    g.temperature = 0.8f;
    g.top_k = 40;
    g.has_seed = 1;
    g.seed = ((uint64_t)st->index << 32) | st->serial;
    g.timeout_ms = (uint32_t)o->timeout_ms;
    char id[RIVER_CLIENT_ID_MAX];
    snprintf(id, sizeof id, "soak-%d-%d-%" PRIu64, (int)getpid(), st->index, st->serial);
    /* The stream is busy before the submit: the callback may run inside a later poll
     * only, but the state must be whole by then. */
    st->busy = true;
    st->next_seq = 0;
    st->tokens = 0;
    st->first_us = 0;
    st->bad_sequence = false;
    snprintf(st->rid, sizeof st->rid, "%s", id);
    st->submit_us = clock_now_us();
    int rc = river_client_submit(cl->c, &g, id, soak_on_event, st, NULL);
    if (rc < 0) {
        st->busy = false;
        atomic_fetch_add(&soak_counts.submit_errors, 1);
        return rc;
    }
    st->serial++;
    atomic_fetch_add(&soak_counts.started, 1);
    return 0;
}

static void *soak_client_main(void *arg)
{
    soak_client_t *cl = arg;
    for (;;) {
        int phase = atomic_load(&soak_phase);
        if (phase == SOAK_DONE)
            break;
        int busy = 0;
        for (int i = 0; i < cl->n_streams; i++) {
            soak_stream_t *st = &cl->streams[i];
            if (!st->busy && phase == SOAK_RUN && soak_submit(cl, st) < 0) {
                /* A submit fails only when the library cannot send at all; counting it
                 * and trying again later keeps the stream alive. */
                snprintf(cl->why, sizeof cl->why, "submit: %s", river_err_detail());
            }
            busy += st->busy;
        }
        if (phase == SOAK_DRAIN && busy == 0)
            break;
        int rc = river_client_poll(cl->c, 50);
        if (rc < 0) {
            cl->err = rc;
            snprintf(cl->why, sizeof cl->why, "poll: %s", river_err_detail());
            break;
        }
        if (cl->err)
            break;
    }
    for (int i = 0; i < cl->n_streams; i++)
        cl->unfinished += cl->streams[i].busy;
    atomic_store(&cl->finished, 1);
    return NULL;
}

/* ---- Resident memory of riverd and its children ---- */

typedef struct soak_proc {
    pid_t pid;
    char name[64];
    long rss_kb;
} soak_proc_t;

/* VmRSS of a process in kB, or -1 when it is gone. */
static long soak_read_rss(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    if (fclose(f) != 0)
        return -1;
    return kb;
}

/* The parent pid and command name of a process, from /proc/PID/stat. */
static int soak_read_stat(pid_t pid, pid_t *ppid, char *name, size_t cap)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    if (fclose(f) != 0 || n == 0)
        return -1;
    buf[n] = '\0';
    /* The name is in parentheses and may hold anything, parentheses included. */
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (!open || !close || close < open)
        return -1;
    snprintf(name, cap, "%.*s", (int)(close - open - 1), open + 1);
    char state;
    int pp;
    if (sscanf(close + 1, " %c %d", &state, &pp) != 2)
        return -1;
    *ppid = (pid_t)pp;
    return 0;
}

/* riverd (first) and its children, with their resident memory now. */
static int soak_sample_procs(pid_t riverd, soak_proc_t *out, int max)
{
    int n = 0;
    char name[64];
    pid_t ppid;
    if (riverd <= 0 || soak_read_stat(riverd, &ppid, name, sizeof name) < 0)
        return 0;
    out[n].pid = riverd;
    snprintf(out[n].name, sizeof out[n].name, "%s", name);
    out[n++].rss_kb = soak_read_rss(riverd);
    DIR *d = opendir("/proc");
    if (!d)
        return n;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid_t pid = (pid_t)atoi(e->d_name);
        if (soak_read_stat(pid, &ppid, name, sizeof name) < 0 || ppid != riverd)
            continue;
        out[n].pid = pid;
        snprintf(out[n].name, sizeof out[n].name, "%s", name);
        out[n++].rss_kb = soak_read_rss(pid);
    }
    if (closedir(d) != 0)
        return n;
    return n;
}

static void soak_print_procs(const char *label, const soak_proc_t *p, int n)
{
    printf("%s", label);
    for (int i = 0; i < n; i++)
        printf("%s %s[%d] %ld kB", i ? "," : "", p[i].name, (int)p[i].pid, p[i].rss_kb);
    printf("\n");
}

/* The fewest requests that have ended on any one client connection. */
static uint64_t soak_min_ended(soak_client_t *cls, int n)
{
    uint64_t m = UINT64_MAX;
    for (int i = 0; i < n; i++) {
        uint64_t k = atomic_load(&cls[i].ended);
        if (k < m)
            m = k;
    }
    return n ? m : 0;
}

/* ---- Report ---- */

static int soak_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted series. */
static double soak_percentile(const soak_series_t *s, double p)
{
    if (!s->n)
        return 0;
    size_t rank = (size_t)(p * (double)s->n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > s->n)
        rank = s->n;
    return s->v[rank - 1];
}

static int soak_merge(soak_series_t *dst, const soak_series_t *src)
{
    for (size_t i = 0; i < src->n; i++)
        if (soak_series_add(dst, src->v[i]) < 0)
            return RIVER_ENOMEM;
    return 0;
}

static void soak_usage(FILE *f)
{
    fprintf(f,
            "usage: river-soak [--endpoint E] [--admin E] [--streams N] [--minutes M | "
            "--seconds S]\n"
            "                  [--clients K] [--pid RIVERD_PID] [--workers W] [--warmup S]\n"
            "                  [--warmup-requests N] [--max-tokens N] [--timeout S] [--grace S]\n"
            "                  [--report-every S] [--key F --server-key F]\n"
            "  --endpoint E    riverd's client endpoint ($RIVER_ENDPOINT, default %s)\n"
            "  --admin E       riverd's admin endpoint ($RIVER_ADMIN, default %s)\n"
            "  --streams N     requests in flight at all times (default 200)\n"
            "  --minutes M     how long the streams run (default 10); --seconds S for short "
            "runs\n"
            "  --clients K     client connections, one thread each (default 4, or one per 50 "
            "streams)\n"
            "  --pid P         riverd's pid: report its and its children's VmRSS\n"
            "  --workers W     first wait until riverd has W ready workers\n"
            "  --warmup S      when the start memory is taken (default 30, at most half the "
            "run)\n"
            "  --warmup-requests N  ...and not before every client connection had N requests "
            "end\n"
            "                  (default 600: ZMQ's per-connection queues at their steady "
            "state)\n"
            "  --max-tokens N  longest request; lengths vary from N/4 to N (default 64)\n"
            "  --timeout S     riverd silent this long about a request: lost (default 120)\n"
            "  --grace S       how long requests may run after the end (default 120)\n"
            "  --report-every S  progress line interval (default 60)\n"
            "  --key F         secret key of the soak's clients, NAME.key_secret ($RIVER_KEY);\n"
            "                  riverd must allow its public key for clients and admin\n"
            "  --server-key F  riverd's public key, riverd.key ($RIVER_SERVER_KEY)\n"
            "Exit status: 0 nothing lost, 1 something lost or the run failed, 2 usage.\n",
            SOAK_ENDPOINT_DEFAULT, SOAK_ADMIN_DEFAULT);
}

static int soak_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static void soak_on_signal(int sig)
{
    (void)sig;
    soak_interrupted = 1;
}

/* Waits until riverd reports `want` ready workers; 0 or a negative error. */
static int soak_wait_workers(const soak_opts_t *o)
{
    river_admin_t *a;
    int rc = river_admin_new_secure(&a, o->admin, 2000, o->keys.secret_key ? &o->keys : NULL);
    if (rc < 0)
        return rc;
    int64_t until = clock_now_us() + 120 * 1000000LL;
    for (;;) {
        river_status_t st;
        rc = river_admin_status(a, &st);
        if (rc == 0 && (int)st.workers_ready >= o->workers)
            break;
        if (clock_now_us() > until || soak_interrupted) {
            rc = river_err_set(RIVER_ETIMEOUT, "riverd has not %d ready workers after 120 s",
                               o->workers);
            break;
        }
        struct timespec ts = {0, 200 * 1000000L};
        if (nanosleep(&ts, NULL) != 0 && errno != EINTR)
            break;
    }
    river_admin_destroy(&a);
    return rc < 0 ? rc : 0;
}

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"endpoint", required_argument, 0, 'e'}, {"admin", required_argument, 0, 'a'},
        {"streams", required_argument, 0, 'n'},  {"minutes", required_argument, 0, 'm'},
        {"seconds", required_argument, 0, 's'},  {"clients", required_argument, 0, 'c'},
        {"pid", required_argument, 0, 'p'},      {"workers", required_argument, 0, 'w'},
        {"warmup", required_argument, 0, 'W'},   {"max-tokens", required_argument, 0, 'k'},
        {"warmup-requests", required_argument, 0, 'R'},
        {"timeout", required_argument, 0, 't'},  {"grace", required_argument, 0, 'g'},
        {"report-every", required_argument, 0, 'r'}, {"help", no_argument, 0, 'h'},
        {"key", required_argument, 0, 'K'},      {"server-key", required_argument, 0, 'S'},
        {0, 0, 0, 0},
    };
    soak_opts_t o = {
        .endpoint = getenv("RIVER_ENDPOINT") ? getenv("RIVER_ENDPOINT") : SOAK_ENDPOINT_DEFAULT,
        .admin = getenv("RIVER_ADMIN") ? getenv("RIVER_ADMIN") : SOAK_ADMIN_DEFAULT,
        .streams = 200,
        .clients = 4,
        .run_ms = 10 * 60000,
        .warmup_ms = 30000,
        .warmup_requests = 600,
        .timeout_ms = 120000,
        .grace_ms = 120000,
        .report_ms = 60000,
        .max_tokens = 64,
        .keys = {.secret_key = getenv("RIVER_KEY"), .server_key = getenv("RIVER_SERVER_KEY")},
    };
    long v;
    int c;
    bool clients_set = false;
    while ((c = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'e': o.endpoint = optarg; break;
        case 'a': o.admin = optarg; break;
        case 'n': bad = soak_parse_int(optarg, 1, 100000, &v); o.streams = (int)v; break;
        case 'm': bad = soak_parse_int(optarg, 1, 100000, &v); o.run_ms = v * 60000; break;
        case 's': bad = soak_parse_int(optarg, 1, 10000000, &v); o.run_ms = v * 1000; break;
        case 'c':
            bad = soak_parse_int(optarg, 1, 1024, &v);
            o.clients = (int)v;
            clients_set = true;
            break;
        case 'p': bad = soak_parse_int(optarg, 1, 1 << 30, &v); o.riverd_pid = (pid_t)v; break;
        case 'w': bad = soak_parse_int(optarg, 0, 1024, &v); o.workers = (int)v; break;
        case 'W': bad = soak_parse_int(optarg, 0, 1000000, &v); o.warmup_ms = v * 1000; break;
        case 'R': bad = soak_parse_int(optarg, 0, 100000000, &v); o.warmup_requests = v; break;
        case 'k': bad = soak_parse_int(optarg, 1, 1 << 20, &v); o.max_tokens = (uint32_t)v; break;
        case 't': bad = soak_parse_int(optarg, 1, 1000000, &v); o.timeout_ms = v * 1000; break;
        case 'g': bad = soak_parse_int(optarg, 0, 1000000, &v); o.grace_ms = v * 1000; break;
        case 'r': bad = soak_parse_int(optarg, 1, 1000000, &v); o.report_ms = v * 1000; break;
        case 'K': o.keys.secret_key = optarg; break;
        case 'S': o.keys.server_key = optarg; break;
        case 'h': soak_usage(stdout); return 0;
        default: bad = 1; break;
        }
        if (bad) {
            soak_usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        soak_usage(stderr);
        return 2;
    }
    /* An empty variable counts as unset; one key without the other is a mistake. */
    if (o.keys.secret_key && !o.keys.secret_key[0])
        o.keys.secret_key = NULL;
    if (o.keys.server_key && !o.keys.server_key[0])
        o.keys.server_key = NULL;
    if (!o.keys.secret_key != !o.keys.server_key) {
        fprintf(stderr, "river-soak: --key and --server-key go together\n");
        return 2;
    }
    /* riverd limits the requests of one connection (limits.max_requests_per_client, 64
     * by default): unless told otherwise, no client carries more than 50 streams. */
    if (!clients_set && o.clients < (o.streams + 49) / 50)
        o.clients = (o.streams + 49) / 50;
    if (o.clients > o.streams)
        o.clients = o.streams;
    if (o.warmup_ms > o.run_ms / 2)
        o.warmup_ms = o.run_ms / 2;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = soak_on_signal;
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) {
        perror("river-soak: sigaction");
        return 1;
    }
    if (o.workers > 0 && soak_wait_workers(&o) < 0) {
        fprintf(stderr, "river-soak: %s\n", river_err_detail());
        return 1;
    }

    soak_client_t *cls = calloc((size_t)o.clients, sizeof *cls);
    soak_stream_t *streams = calloc((size_t)o.streams, sizeof *streams);
    if (!cls || !streams) {
        fprintf(stderr, "river-soak: out of memory\n");
        return 1;
    }
    /* Streams go to clients in turn; each client's are contiguous in `streams`. */
    int next = 0;
    for (int i = 0; i < o.clients; i++) {
        soak_client_t *cl = &cls[i];
        cl->o = &o;
        cl->index = i;
        cl->n_streams = o.streams / o.clients + (i < o.streams % o.clients);
        cl->streams = &streams[next];
        for (int j = 0; j < cl->n_streams; j++) {
            cl->streams[j].owner = cl;
            cl->streams[j].index = next + j;
        }
        next += cl->n_streams;
        if (river_client_new_secure(&cl->c, o.endpoint, o.keys.secret_key ? &o.keys : NULL) <
            0) {
            fprintf(stderr, "river-soak: %s: %s\n", o.endpoint, river_err_detail());
            return 1;
        }
    }

    printf("river-soak: %d streams on %d clients for %.0f s (warm-up: %.0f s and %" PRId64
           " requests a connection, at most %.0f s) against %s\n",
           o.streams, o.clients, (double)o.run_ms / 1000, (double)o.warmup_ms / 1000,
           o.warmup_requests, (double)o.run_ms / 2000, o.endpoint);
    fflush(stdout);
    int64_t t0 = clock_now_us();
    for (int i = 0; i < o.clients; i++) {
        int e = pthread_create(&cls[i].thread, NULL, soak_client_main, &cls[i]);
        if (e != 0) {
            fprintf(stderr, "river-soak: pthread_create: %s\n", strerror(e));
            atomic_store(&soak_phase, SOAK_DONE);
            for (int j = 0; j < i; j++)
                pthread_join(cls[j].thread, NULL);
            return 1;
        }
    }

    soak_proc_t start[SOAK_MAX_PROCS], end[SOAK_MAX_PROCS], now_p[SOAK_MAX_PROCS];
    int n_start = 0, n_end = 0;
    bool warm = false;
    int64_t next_report = t0 + o.report_ms * 1000;
    uint64_t last_tokens = 0;
    int64_t last_report = t0;
    int64_t t_end = t0 + o.run_ms * 1000;
    uint64_t tokens_at_end = 0;
    /* riverd's VmRSS after the warm-up: its range, sampled every SOAK_RSS_EVERY_US. */
    long rss_min = -1, rss_max = -1;
    int64_t warm_at = 0, next_rss = 0;
    /* The main thread keeps time: warm-up, progress lines, the end of the run. */
    for (;;) {
        int64_t now = clock_now_us();
        if (!warm && now >= t0 + o.warmup_ms * 1000 &&
            (soak_min_ended(cls, o.clients) >= (uint64_t)o.warmup_requests ||
             now >= t0 + o.run_ms * 1000 / 2)) {
            warm = true;
            warm_at = now;
            n_start = soak_sample_procs(o.riverd_pid, start, SOAK_MAX_PROCS);
            printf("warm-up: %.0f s, every connection had %" PRIu64 " requests end\n",
                   (double)(now - t0) / 1e6, soak_min_ended(cls, o.clients));
            soak_print_procs("memory at the end of the warm-up:", start, n_start);
            fflush(stdout);
        }
        if (warm && o.riverd_pid > 0 && now >= next_rss) {
            long kb = soak_read_rss(o.riverd_pid);
            if (kb >= 0 && (rss_min < 0 || kb < rss_min))
                rss_min = kb;
            if (kb > rss_max)
                rss_max = kb;
            next_rss = now + SOAK_RSS_EVERY_US;
        }
        if (now >= t_end || soak_interrupted) {
            t_end = now;
            break;
        }
        if (now >= next_report) {
            uint64_t tok = atomic_load(&soak_counts.tokens);
            printf("[%4.0f s] started %" PRIu64 ", completed %" PRIu64 ", failed %" PRIu64
                   ", lost %" PRIu64 ", %.0f tokens/s;",
                   (double)(now - t0) / 1e6, (uint64_t)atomic_load(&soak_counts.started),
                   (uint64_t)atomic_load(&soak_counts.completed),
                   (uint64_t)atomic_load(&soak_counts.failed),
                   (uint64_t)(atomic_load(&soak_counts.lost_silent) +
                              atomic_load(&soak_counts.lost_sequence) +
                              atomic_load(&soak_counts.lost_count)),
                   (double)(tok - last_tokens) / ((double)(now - last_report) / 1e6));
            int k = soak_sample_procs(o.riverd_pid, now_p, SOAK_MAX_PROCS);
            soak_print_procs(" rss", now_p, k);
            fflush(stdout);
            last_tokens = tok;
            last_report = now;
            next_report += o.report_ms * 1000;
        }
        struct timespec ts = {0, 100 * 1000000L};
        if (nanosleep(&ts, NULL) != 0 && errno != EINTR)
            break;
    }
    tokens_at_end = atomic_load(&soak_counts.tokens);
    n_end = soak_sample_procs(o.riverd_pid, end, SOAK_MAX_PROCS);
    if (!warm) {
        memcpy(start, end, sizeof end);
        n_start = n_end;
    }
    /* No new requests; those running may finish within the grace period. */
    atomic_store(&soak_phase, SOAK_DRAIN);
    int64_t drain_until = clock_now_us() + o.grace_ms * 1000;
    for (;;) {
        /* Each thread returns once its streams are idle. */
        int running = 0;
        for (int i = 0; i < o.clients; i++)
            running += !atomic_load(&cls[i].finished);
        if (!running || clock_now_us() >= drain_until)
            break;
        struct timespec ts = {0, 100 * 1000000L};
        if (nanosleep(&ts, NULL) != 0 && errno != EINTR)
            break;
    }
    atomic_store(&soak_phase, SOAK_DONE);
    int64_t t_drained = clock_now_us();

    soak_series_t e2e = {0}, ttft = {0};
    int unfinished = 0, thread_errors = 0;
    for (int i = 0; i < o.clients; i++) {
        soak_client_t *cl = &cls[i];
        pthread_join(cl->thread, NULL);
        unfinished += cl->unfinished;
        if (cl->err) {
            thread_errors++;
            fprintf(stderr, "river-soak: client %d: %s\n", i, cl->why);
        }
        if (soak_merge(&e2e, &cl->e2e) < 0 || soak_merge(&ttft, &cl->ttft) < 0) {
            fprintf(stderr, "river-soak: out of memory\n");
            return 1;
        }
        river_client_destroy(&cl->c);
        free(cl->e2e.v);
        free(cl->ttft.v);
    }
    qsort(e2e.v, e2e.n, sizeof *e2e.v, soak_cmp_double);
    qsort(ttft.v, ttft.n, sizeof *ttft.v, soak_cmp_double);

    uint64_t started = atomic_load(&soak_counts.started);
    uint64_t completed = atomic_load(&soak_counts.completed);
    uint64_t failed = atomic_load(&soak_counts.failed);
    uint64_t silent = atomic_load(&soak_counts.lost_silent);
    uint64_t bad_seq = atomic_load(&soak_counts.lost_sequence);
    uint64_t bad_count = atomic_load(&soak_counts.lost_count);
    uint64_t lost = started - completed - failed;
    double run_s = (double)(t_end - t0) / 1e6;

    printf("\n== river-soak report: %d streams, %d clients, %.1f s run, %.1f s drain\n",
           o.streams, o.clients, run_s, (double)(t_drained - t_end) / 1e6);
    printf("requests   started %" PRIu64 ", completed %" PRIu64 ", failed %" PRIu64
           ", lost %" PRIu64 "\n",
           started, completed, failed, lost);
    printf("lost       no final reply %" PRIu64 ", chunks repeated or skipped %" PRIu64
           ", token count off %" PRIu64 ", unfinished after the grace period %d\n",
           silent, bad_seq, bad_count, unfinished);
    /* Every started request ends in exactly one of the counts; a difference would be a
     * bug here, and would hide a loss. */
    if (silent + bad_seq + bad_count + (uint64_t)unfinished != lost)
        printf("lost       WARNING: the causes add up to %" PRIu64 ", not %" PRIu64 "\n",
               silent + bad_seq + bad_count + (uint64_t)unfinished, lost);
    printf("errors    ");
    uint64_t any = 0;
    for (int i = 0; i < SOAK_CODES; i++) {
        uint64_t k = atomic_load(&soak_counts.codes[i]);
        if (k)
            printf(" %s %" PRIu64, river_code_name((river_code_t)i), k);
        any += k;
    }
    printf("%s\n", any ? "" : " none");
    printf("finish    ");
    for (int i = 0; i < SOAK_FINISHES; i++) {
        uint64_t k = atomic_load(&soak_counts.finishes[i]);
        if (k)
            printf(" %s %" PRIu64, river_finish_name((river_finish_t)i), k);
    }
    printf("\n");
    if (atomic_load(&soak_counts.submit_errors))
        printf("submits    %" PRIu64 " failed in the library (not started)\n",
               (uint64_t)atomic_load(&soak_counts.submit_errors));
    printf("latency    end-to-end p50 %.1f ms, p99 %.1f ms; first token p50 %.1f ms, p99 %.1f "
           "ms (%zu requests)\n",
           soak_percentile(&e2e, 0.50), soak_percentile(&e2e, 0.99),
           soak_percentile(&ttft, 0.50), soak_percentile(&ttft, 0.99), e2e.n);
    printf("tokens     %" PRIu64 " in %.1f s: %.1f tokens/s\n", tokens_at_end, run_s,
           run_s > 0 ? (double)tokens_at_end / run_s : 0.0);
    printf("memory     VmRSS at the end of the warm-up and at the end of the run\n");
    for (int i = 0; i < n_start; i++) {
        long e = -1;
        for (int j = 0; j < n_end; j++)
            if (end[j].pid == start[i].pid)
                e = end[j].rss_kb;
        if (e < 0) {
            printf("           %-13s pid %-7d start %7ld kB, gone by the end (restarted?)\n",
                   start[i].name, (int)start[i].pid, start[i].rss_kb);
            continue;
        }
        long g = e - start[i].rss_kb;
        printf("           %-13s pid %-7d start %7ld kB, end %7ld kB, growth %+ld kB (%+.1f%%)\n",
               start[i].name, (int)start[i].pid, start[i].rss_kb, e, g,
               start[i].rss_kb > 0 ? 100.0 * (double)g / (double)start[i].rss_kb : 0.0);
    }
    for (int j = 0; j < n_end; j++) {
        bool seen = false;
        for (int i = 0; i < n_start; i++)
            seen |= end[j].pid == start[i].pid;
        if (!seen)
            printf("           %-13s pid %-7d new since the warm-up (a restart): end %7ld kB\n",
                   end[j].name, (int)end[j].pid, end[j].rss_kb);
    }
    if (!n_start)
        printf("           (no --pid: not measured)\n");
    else if (rss_min >= 0)
        printf("           riverd after the warm-up (%.0f s, every %d s): min %ld kB, max %ld kB, "
               "range %ld kB\n",
               (double)(t_end - warm_at) / 1e6, SOAK_RSS_EVERY_US / 1000000, rss_min, rss_max,
               rss_max - rss_min);
    bool pass = lost == 0 && thread_errors == 0;
    printf("result     %s\n", pass ? "PASS: no request lost"
                                   : lost ? "FAIL: requests lost"
                                          : "FAIL: a client thread failed");
    free(e2e.v);
    free(ttft.v);
    free(streams);
    free(cls);
    return pass ? 0 : 1;
}
