/* riverctl: the operator's and the shell's way to riverd.
 *
 *     riverctl [--endpoint E] [--admin E] [--key F --server-key F] [--timeout MS]
 *              [--output text|json] COMMAND
 *
 * Commands are a table: each has its name, its usage line and a function. Admin commands
 * go to the admin endpoint, generate to the client endpoint, through the client library
 * (client/river_client.h), with CurveZMQ keys when --key and --server-key (or RIVER_KEY and
 * RIVER_SERVER_KEY) name them; keygen writes such keys. Exit status: 0 done, 1 riverd
 * refused or failed, 2 usage. */
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/river_client.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/keys.h"

#define CTL_ENDPOINT_DEFAULT "tcp://127.0.0.1:5555"
#define CTL_ADMIN_DEFAULT "tcp://127.0.0.1:5557"
#define CTL_TIMEOUT_DEFAULT_MS 60000
#define CTL_ADMIN_TIMEOUT_DEFAULT_MS 5000
#define CTL_MAX_STOP 64

typedef struct ctl {
    const char *endpoint, *admin;
    int timeout_ms;       /* generate: riverd silent this long */
    int admin_timeout_ms; /* admin commands: no answer within this */
    bool json;
    river_keys_t keys;    /* both NULL: no CURVE (riverd's auth.mode plain) */
} ctl_t;

/* The keys to connect with, NULL for none. */
static const river_keys_t *ctl__keys(const ctl_t *c)
{
    return c->keys.secret_key ? &c->keys : NULL;
}

static int ctl__fail(const char *what)
{
    fprintf(stderr, "riverctl: %s: %s\n", what, river_err_detail());
    return 1;
}

static int ctl__parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || v > UINT32_MAX || s[0] == '-')
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int ctl__admin(const ctl_t *c, river_admin_t **a)
{
    int rc = river_admin_new_secure(a, c->admin, c->admin_timeout_ms, ctl__keys(c));
    return rc < 0 ? ctl__fail(c->admin) : 0;
}

static void ctl__print_json(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(o);
}

/* ---- Admin commands ---- */

static int ctl_status(const ctl_t *c, int argc, char **argv)
{
    if (argc != 1)
        return 2;
    river_admin_t *a;
    if (ctl__admin(c, &a))
        return 1;
    river_status_t st;
    int rc = river_admin_status(a, &st);
    river_admin_destroy(&a);
    if (rc < 0)
        return ctl__fail("status");
    if (c->json) {
        json_t *o = json_pack("{s:s, s:I, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:b}", "version",
                              st.version, "uptime_s", (json_int_t)st.uptime_s, "workers_ready",
                              (int)st.workers_ready, "workers_total", (int)st.workers_total,
                              "queue_length", (int)st.queue_length, "queue_capacity",
                              (int)st.queue_capacity, "running", (int)st.running,
                              "requests_total", (json_int_t)st.requests_total,
                              "requests_failed", (json_int_t)st.requests_failed, "draining",
                              st.draining);
        ctl__print_json(o);
        return 0;
    }
    printf("riverd %s, up %llu s%s\n", st.version, (unsigned long long)st.uptime_s,
           st.draining ? ", draining" : "");
    printf("workers   %u ready of %u\n", st.workers_ready, st.workers_total);
    printf("queue     %u of %u\n", st.queue_length, st.queue_capacity);
    printf("running   %u\n", st.running);
    printf("requests  %llu, %llu failed\n", (unsigned long long)st.requests_total,
           (unsigned long long)st.requests_failed);
    return 0;
}

static int ctl_workers(const ctl_t *c, int argc, char **argv)
{
    if (argc != 1)
        return 2;
    river_admin_t *a;
    if (ctl__admin(c, &a))
        return 1;
    river_worker_info_t *w;
    size_t n;
    int rc = river_admin_workers(a, &w, &n);
    river_admin_destroy(&a);
    if (rc < 0)
        return ctl__fail("workers");
    if (c->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(
                arr, json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, "
                               "s:I, s:b, s:i}",
                               "id", w[i].id, "address", w[i].address, "state", w[i].state, "role", w[i].role, "model",
                               w[i].model, "max_seqs", (int)w[i].max_seqs, "running",
                               (int)w[i].running, "queue_length", (int)w[i].queue_length,
                               "kv_pages_free", (int)w[i].kv_pages_free, "kv_pages_total",
                               (int)w[i].kv_pages_total, "kv_page_size",
                               (int)w[i].kv_page_size, "missed_beats", (int)w[i].missed_beats,
                               "last_seen_ms", (json_int_t)w[i].last_seen_ms, "supervised",
                               w[i].supervised, "n_layers", (int)w[i].n_layers));
        ctl__print_json(arr);
    } else {
        printf("%-20s %-15s %-9s %-8s %-20s %5s %7s %5s %13s %9s %s\n", "ID", "ADDRESS",
               "STATE", "ROLE", "MODEL", "SEQS", "RUNNING", "QUEUE", "KV FREE/TOTAL",
               "SEEN(ms)", "SUPERVISED");
        for (size_t i = 0; i < n; i++)
            printf("%-20s %-15s %-9s %-8s %-20s %5u %7u %5u %6u/%-6u %9llu %s\n", w[i].id,
                   w[i].address[0] ? w[i].address : "-", w[i].state, w[i].role, w[i].model, w[i].max_seqs, w[i].running,
                   w[i].queue_length, w[i].kv_pages_free, w[i].kv_pages_total,
                   (unsigned long long)w[i].last_seen_ms, w[i].supervised ? "yes" : "no");
    }
    free(w);
    return 0;
}

static int ctl_drain(const ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"deadline", required_argument, 0, 'd'},
        {"all", no_argument, 0, 'a'},
        {0, 0, 0, 0},
    };
    uint32_t deadline = 0;
    bool all = false;
    int o;
    optind = 0; /* 0, not 1: glibc then forgets the "+" mode of the first parse */
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'd':
            if (ctl__parse_u32(optarg, &deadline))
                return 2;
            break;
        case 'a': all = true; break;
        default: return 2;
        }
    }
    if (all ? optind != argc : optind != argc - 1)
        return 2;
    river_admin_t *a;
    if (ctl__admin(c, &a))
        return 1;
    uint32_t n = 0;
    int rc = river_admin_drain(a, all ? "" : argv[optind], deadline, &n);
    river_admin_destroy(&a);
    if (rc < 0)
        return ctl__fail("drain");
    printf("%u draining\n", n);
    return 0;
}

static int ctl_scale(const ctl_t *c, int argc, char **argv)
{
    uint32_t n;
    if (argc != 2 || ctl__parse_u32(argv[1], &n))
        return 2;
    river_admin_t *a;
    if (ctl__admin(c, &a))
        return 1;
    uint32_t prev = 0;
    int rc = river_admin_scale(a, n, &prev);
    river_admin_destroy(&a);
    if (rc < 0)
        return ctl__fail("scale");
    printf("local workers: %u -> %u\n", prev, n);
    return 0;
}

static int ctl_reload(const ctl_t *c, int argc, char **argv)
{
    if (argc != 1)
        return 2;
    river_admin_t *a;
    if (ctl__admin(c, &a))
        return 1;
    char *applied, *restart;
    int rc = river_admin_reload(a, &applied, &restart);
    river_admin_destroy(&a);
    if (rc < 0)
        return ctl__fail("reload");
    printf("applied: %s\nneeds restart: %s\n", applied[0] ? applied : "(nothing)",
           restart[0] ? restart : "(nothing)");
    free(applied);
    free(restart);
    return 0;
}

static int ctl_metrics(const ctl_t *c, int argc, char **argv)
{
    if (argc != 1)
        return 2;
    river_admin_t *a;
    if (ctl__admin(c, &a))
        return 1;
    char *text;
    int rc = river_admin_metrics(a, &text);
    river_admin_destroy(&a);
    if (rc < 0)
        return ctl__fail("metrics");
    fputs(text, stdout);
    free(text);
    return 0;
}

/* ---- generate ---- */

typedef struct gen_out {
    bool json;
    json_t *ids, *exit_layers;
    char *text;
    size_t n_text, cap_text;
    uint64_t next_seq;
    bool bad_seq;
    double first_s;  /* when the first chunk arrived, 0 before */
    double last_s;   /* when the last chunk arrived */
    uint64_t n_chunk_ids; /* ids after the first chunk's */
    /* How it ended. */
    river_event_kind_t end;
    river_finish_t finish;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    river_code_t code;
    char message[512];
} gen_out_t;

static volatile sig_atomic_t ctl__interrupted;

static void ctl__on_sigint(int sig)
{
    (void)sig;
    ctl__interrupted = 1;
}

static void ctl__on_event(void *user, const river_event_t *ev)
{
    gen_out_t *o = user;
    if (ev->kind != RIVER_EVENT_CHUNK) {
        o->end = ev->kind;
        o->finish = ev->finish;
        o->prompt_tokens = ev->prompt_tokens;
        o->completion_tokens = ev->completion_tokens;
        o->cached_tokens = ev->cached_tokens;
        o->code = ev->code;
        snprintf(o->message, sizeof o->message, "%s", ev->message ? ev->message : "");
        return;
    }
    /* Decode speed is measured from the first chunk on, so prefill does not count. */
    double now = clock_now_s();
    if (o->first_s == 0)
        o->first_s = now;
    else
        o->n_chunk_ids += ev->n_ids;
    o->last_s = now;
    /* riverd promises consecutive sequence numbers; say so when it breaks that. */
    if (ev->seq != o->next_seq)
        o->bad_seq = true;
    o->next_seq = ev->seq + 1;
    if (!o->json) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        return;
    }
    for (size_t i = 0; i < ev->n_ids; i++)
        json_array_append_new(o->ids, json_integer(ev->ids[i]));
    for (size_t i = 0; i < ev->n_exit_layers; i++)
        json_array_append_new(o->exit_layers, json_integer(ev->exit_layers[i]));
    if (o->n_text + ev->text_len + 1 > o->cap_text) {
        size_t cap = (o->cap_text + ev->text_len + 1) * 2;
        char *t = realloc(o->text, cap);
        if (!t)
            return;
        o->text = t;
        o->cap_text = cap;
    }
    memcpy(o->text + o->n_text, ev->text, ev->text_len);
    o->n_text += ev->text_len;
    o->text[o->n_text] = '\0';
}


static int ctl_generate(const ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"max-tokens", required_argument, 0, 'n'}, {"temperature", required_argument, 0, 't'},
        {"top-k", required_argument, 0, 'K'},      {"top-p", required_argument, 0, 'P'},
        {"seed", required_argument, 0, 's'},       {"stop", required_argument, 0, 'S'},
        {"session", required_argument, 0, 'i'},    {"deadline", required_argument, 0, 'd'},
        {"ignore-eos", no_argument, 0, 'E'},       {"output", required_argument, 0, 'o'},
        {0, 0, 0, 0},
    };
    river_generate_opts_t go = RIVER_GENERATE_OPTS_INIT;
    const char *stop[CTL_MAX_STOP];
    bool json = c->json;
    int o;
    optind = 0; /* 0, not 1: glibc then forgets the "+" mode of the first parse */
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (o) {
        case 'n':
            if (ctl__parse_u32(optarg, &go.max_tokens))
                return 2;
            break;
        case 't':
            go.temperature = strtof(optarg, &end);
            if (*end || go.temperature < 0)
                return 2;
            break;
        case 'K':
            if (ctl__parse_u32(optarg, &go.top_k))
                return 2;
            break;
        case 'P':
            go.top_p = strtof(optarg, &end);
            if (*end)
                return 2;
            break;
        case 's':
            go.seed = strtoull(optarg, &end, 10);
            if (*end || !optarg[0])
                return 2;
            go.has_seed = 1;
            break;
        case 'S':
            if (go.n_stop == CTL_MAX_STOP)
                return 2;
            stop[go.n_stop++] = optarg;
            break;
        case 'i': go.session_id = optarg; break;
        case 'd':
            if (ctl__parse_u32(optarg, &go.deadline_ms))
                return 2;
            break;
        case 'E': go.ignore_eos = 1; break;
        case 'o':
            if (strcmp(optarg, "json") && strcmp(optarg, "text"))
                return 2;
            json = !strcmp(optarg, "json");
            break;
        default: return 2;
        }
    }
    if (optind != argc - 1)
        return 2;
    go.prompt = argv[optind];
    go.stop = stop;
    go.timeout_ms = (uint32_t)c->timeout_ms;

    river_client_t *cl;
    if (river_client_new_secure(&cl, c->endpoint, ctl__keys(c)) < 0)
        return ctl__fail(c->endpoint);
    gen_out_t out = {.json = json};
    if (json) {
        out.ids = json_array();
        out.exit_layers = json_array();
    }
    /* Ctrl-C cancels the request; riverd answers with the Final (cancelled). */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ctl__on_sigint;
    sigaction(SIGINT, &sa, NULL);

    char id[RIVER_CLIENT_ID_MAX];
    double t0 = clock_now_s();
    int rc = river_client_submit(cl, &go, NULL, ctl__on_event, &out, id);
    /* The library reports the end through the callback; keep the result beside it. */
    bool cancelled = false;
    while (rc == 0 && river_client_in_flight(cl) > 0) {
        if (ctl__interrupted && !cancelled) {
            cancelled = true;
            river_client_cancel(cl, id);
        }
        rc = river_client_poll(cl, 100);
        if (rc > 0)
            rc = 0;
    }
    double dt = clock_now_s() - t0;
    river_client_destroy(&cl);
    int status = 0;
    if (rc < 0) {
        status = ctl__fail("generate");
    } else if (out.end == RIVER_EVENT_ERROR) {
        fprintf(stderr, "%sriverctl: %s: %s\n", json ? "" : "\n", river_code_name(out.code),
                out.message);
        status = 1;
    } else if (out.bad_seq) {
        fprintf(stderr, "riverctl: chunks out of sequence\n");
        status = 1;
    }
    if (json) {
        json_t *obj = json_object();
        json_object_set_new(obj, "ids", out.ids);
        json_object_set_new(obj, "exit_layers", out.exit_layers);
        json_object_set_new(obj, "text", json_stringn(out.text ? out.text : "", out.n_text));
        if (out.end == RIVER_EVENT_FINAL) {
            json_object_set_new(obj, "finish", json_string(river_finish_name(out.finish)));
            json_object_set_new(obj, "prompt_tokens", json_integer(out.prompt_tokens));
            json_object_set_new(obj, "completion_tokens", json_integer(out.completion_tokens));
            json_object_set_new(obj, "cached_tokens", json_integer(out.cached_tokens));
        } else if (out.end == RIVER_EVENT_ERROR) {
            json_object_set_new(obj, "error", json_pack("{s:s, s:s}", "code",
                                                        river_code_name(out.code), "message",
                                                        out.message));
        }
        json_object_set_new(obj, "elapsed_s", json_real(dt));
        if (out.first_s > 0) {
            json_object_set_new(obj, "first_token_s", json_real(out.first_s - t0));
            if (out.last_s > out.first_s)
                json_object_set_new(obj, "decode_tok_s",
                                    json_real((double)out.n_chunk_ids /
                                              (out.last_s - out.first_s)));
        }
        ctl__print_json(obj);
    } else if (out.end == RIVER_EVENT_FINAL) {
        printf("\n");
    }
    free(out.text);
    return status;
}

/* ---- keygen ---- */

/* Writes a key pair with CZMQ's zcert: NAME.key, the public half that riverd's auth
 * directories (or, for riverd's own key, its clients and workers) are given, and
 * NAME.key_secret, which stays with its owner. */
static int ctl_keygen(const ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"dir", required_argument, 0, 'd'},
        {0, 0, 0, 0},
    };
    const char *dir = ".";
    int o;
    optind = 0; /* 0, not 1: glibc then forgets the "+" mode of the first parse */
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'd': dir = optarg; break;
        default: return 2;
        }
    }
    if (optind != argc - 1)
        return 2;
    const char *name = argv[optind];
    char pub[KEYS_Z85_LEN + 1];
    if (keys_generate(dir, name, pub) < 0)
        return ctl__fail("keygen");
    if (c->json) {
        char public_file[4200], secret_file[4200];
        snprintf(public_file, sizeof public_file, "%s/%s.key", dir, name);
        snprintf(secret_file, sizeof secret_file, "%s/%s.key_secret", dir, name);
        ctl__print_json(json_pack("{s:s, s:s, s:s, s:s}", "name", name, "public_key", pub,
                                  "public_file", public_file, "secret_file", secret_file));
        return 0;
    }
    printf("%s/%s.key         public key %s: give it to riverd (auth.clients, auth.workers "
           "or auth.admin), or, for riverd's own key, to its clients and workers\n"
           "%s/%s.key_secret  secret key (mode 0600): it stays where it is\n",
           dir, name, pub, dir, name);
    return 0;
}

/* ---- Commands ---- */

static const struct {
    const char *name;
    const char *usage;
    int (*fn)(const ctl_t *c, int argc, char **argv);
} ctl__commands[] = {
    {"status", "status", ctl_status},
    {"workers", "workers", ctl_workers},
    {"drain", "drain WORKER [--deadline MS] | drain --all [--deadline MS]", ctl_drain},
    {"scale", "scale N", ctl_scale},
    {"reload", "reload", ctl_reload},
    {"metrics", "metrics", ctl_metrics},
    {"keygen", "keygen NAME [--dir DIR]", ctl_keygen},
    {"generate",
     "generate PROMPT [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
     "                   [--stop S]... [--session ID] [--deadline MS] [--ignore-eos]\n"
     "                   [--output text|json]",
     ctl_generate},
};

static void ctl__usage(FILE *f)
{
    fprintf(f, "usage: riverctl [--endpoint E] [--admin E] [--key F --server-key F] [--timeout MS]\n"
               "                [--output text|json] COMMAND\n"
               "  --endpoint E      riverd's client endpoint ($RIVER_ENDPOINT, default %s)\n"
               "  --admin E         riverd's admin endpoint ($RIVER_ADMIN, default %s)\n"
               "  --key F           this client's secret key, NAME.key_secret ($RIVER_KEY), for\n"
               "                    a riverd with auth.mode curve: its NAME.key must be in\n"
               "                    riverd's auth.admin (admin commands) or auth.clients\n"
               "                    (generate)\n"
               "  --server-key F    riverd's public key, riverd.key ($RIVER_SERVER_KEY)\n"
               "  --timeout MS      give up when riverd says nothing for this long (default: %d\n"
               "                    for generate, %d for the admin commands)\n"
               "commands:\n",
            CTL_ENDPOINT_DEFAULT, CTL_ADMIN_DEFAULT, CTL_TIMEOUT_DEFAULT_MS,
            CTL_ADMIN_TIMEOUT_DEFAULT_MS);
    for (size_t i = 0; i < sizeof ctl__commands / sizeof ctl__commands[0]; i++)
        fprintf(f, "  riverctl %s\n", ctl__commands[i].usage);
    fprintf(f, "generate streams the text as it arrives; --output json prints "
               "{\"ids\":[...],\"exit_layers\":[...],\"text\":...} at the end.\n"
               "keygen writes DIR/NAME.key (public) and DIR/NAME.key_secret (secret, mode 0600)\n"
               "and never replaces a key.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, 0, 'e'}, {"admin", required_argument, 0, 'a'},
        {"timeout", required_argument, 0, 't'},  {"output", required_argument, 0, 'o'},
        {"key", required_argument, 0, 'k'},      {"server-key", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0},
    };
    ctl_t c = {
        .endpoint = getenv("RIVER_ENDPOINT") ? getenv("RIVER_ENDPOINT") : CTL_ENDPOINT_DEFAULT,
        .admin = getenv("RIVER_ADMIN") ? getenv("RIVER_ADMIN") : CTL_ADMIN_DEFAULT,
        .timeout_ms = CTL_TIMEOUT_DEFAULT_MS,
        .admin_timeout_ms = CTL_ADMIN_TIMEOUT_DEFAULT_MS,
        .keys = {.secret_key = getenv("RIVER_KEY"), .server_key = getenv("RIVER_SERVER_KEY")},
    };
    int o;
    uint32_t t;
    /* "+": options after the command belong to the command. */
    while ((o = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (o) {
        case 'e': c.endpoint = optarg; break;
        case 'a': c.admin = optarg; break;
        case 'k': c.keys.secret_key = optarg; break;
        case 's': c.keys.server_key = optarg; break;
        case 't':
            if (ctl__parse_u32(optarg, &t) || t == 0 || t > INT32_MAX) {
                ctl__usage(stderr);
                return 2;
            }
            c.timeout_ms = c.admin_timeout_ms = (int)t;
            break;
        case 'o':
            if (strcmp(optarg, "json") && strcmp(optarg, "text")) {
                ctl__usage(stderr);
                return 2;
            }
            c.json = !strcmp(optarg, "json");
            break;
        case 'h': ctl__usage(stdout); return 0;
        default: ctl__usage(stderr); return 2;
        }
    }
    if (optind >= argc) {
        ctl__usage(stderr);
        return 2;
    }
    /* An empty variable counts as unset; one key without the other is a mistake. */
    if (c.keys.secret_key && !c.keys.secret_key[0])
        c.keys.secret_key = NULL;
    if (c.keys.server_key && !c.keys.server_key[0])
        c.keys.server_key = NULL;
    if (!c.keys.secret_key != !c.keys.server_key) {
        fprintf(stderr, "riverctl: --key and --server-key go together (a secret key of this "
                        "client and riverd's public key)\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof ctl__commands / sizeof ctl__commands[0]; i++) {
        if (strcmp(argv[optind], ctl__commands[i].name))
            continue;
        int rc = ctl__commands[i].fn(&c, argc - optind, argv + optind);
        if (rc == 2)
            fprintf(stderr, "usage: riverctl %s\n", ctl__commands[i].usage);
        return rc;
    }
    fprintf(stderr, "riverctl: unknown command '%s'\n", argv[optind]);
    ctl__usage(stderr);
    return 2;
}
