/* Workers on other hosts: riverd, its workers and its clients each in a network namespace
 * of their own, joined by veth pairs on a bridge, all over tcp:// with CURVE, and real
 * network faults. Needs root (`make test-multihost`); where namespaces cannot be made it
 * says so in one line and passes.
 *
 * The test makes everything it uses and removes it again, also when it fails: the
 * namespaces (named rvmh<pid>-<host>, so that two runs never meet; one left by a run that
 * was killed is removed by the next), the veth pairs and the bridge inside them, and the
 * processes in them. Addresses are on 10.213.0.0/24, which exists only inside the
 * namespaces; nothing outside this machine is ever addressed.
 *
 *     hub:  br0, one port per host (v-rd, v-w0, ...): "ip link set down" on a port cuts
 *           that host's cable
 *     rd    10.213.0.1   riverd: clients :5555, workers :5556, admin :5557
 *     w0    10.213.0.10  a worker host
 *     w1    10.213.0.11  a worker host
 *     w2    10.213.0.12  a spare worker host (a moved or replacement worker)
 *     cl    10.213.0.20  the clients and riverctl: this test's own threads run here
 *
 * Every request is checked with the fault suites' stream checker (tests/streams.c): it
 * completed exactly once with the tokens of a greedy reference run, or ended with an
 * explicit error; none is lost and no token arrives twice.
 *
 *   link_cut       a worker's link cut mid-stream, then back
 *   loss_delay     20% packet loss each way and 50 ms delay each way on a worker's link
 *   riverd_cut     riverd's link cut: clients get UNAVAILABLE, workers come back
 *   moved          a worker restarted with the same key on another host
 *   drain_replace  riverctl drain of a worker under load, then its replacement
 *   firewall       riverd's host firewall (deploy/MULTI-HOST.md) lets in whom it should
 *
 * netem is not available on every kernel, so loss is iptables' `statistic` match and
 * delay a small relay in the worker's namespace (a thread of this test) that holds every
 * chunk for the delay before passing it on. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "client/river_client.h"
#include "common/clock.h"
#include "common/err.h"
#include "tests/cluster.h"
#include "tests/proc.h"
#include "tests/streams.h"
#include "tests/testutil.h"

#define MH_FAST_MODEL TEST_DATA "/tinystories-656k"
#define MH_SLOW_MODEL TEST_DATA "/kjv-12l" /* 12 layers: streams last long enough to cut */
#define MH_SUBNET "10.213.0"
#define MH_PORT_CLIENTS 5555
#define MH_PORT_WORKERS 5556
#define MH_PORT_ADMIN 5557
#define MH_PORT_RELAY 6556
/* The client library's ZMTP heartbeat gives a silent riverd up after about 12 s
 * (README, Serving: riverd is killed or restarted). */
#define MH_CLIENT_GIVES_UP_S 12.0

/* ---- Hosts and namespaces ---- */

enum { MH_RD, MH_W0, MH_W1, MH_W2, MH_CL, MH_HOSTS };
static const char *const mh_hosts[MH_HOSTS] = {"rd", "w0", "w1", "w2", "cl"};
static const int mh_octet[MH_HOSTS] = {1, 10, 11, 12, 20};

static char mh_prefix[32];   /* rvmh<pid> */
static pid_t mh_owner;       /* the process that made the namespaces removes them */
static int mh_made;          /* namespaces made so far (hub first) */
static const char *mh_ip = "/usr/sbin/ip";
static char mh_log[300];     /* what the ip and iptables commands said */

static const char *mh_ns(int host)
{
    static char names[MH_HOSTS + 1][48];
    char *n = names[host < 0 ? MH_HOSTS : host];
    snprintf(n, sizeof names[0], "%s-%s", mh_prefix, host < 0 ? "hub" : mh_hosts[host]);
    return n;
}

static const char *mh_addr(int host)
{
    static char a[MH_HOSTS][24];
    snprintf(a[host], sizeof a[host], MH_SUBNET ".%d", mh_octet[host]);
    return a[host];
}

/* Runs a shell command line (formatted), its output appended to mh_log; the exit code. */
static int mh_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int mh_sh(const char *fmt, ...)
{
    char cmd[1024], line[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "{ %s ; } >>%s 2>&1", cmd, mh_log[0] ? mh_log : "/dev/null");
    int st = system(line);
    return st == -1 ? -1 : test_exit_code(st);
}

/* Kills what runs in a namespace, then removes it (its veth ends go with it). */
static void mh_ns_remove(const char *ns)
{
    mh_sh("for p in $(%s netns pids %s 2>/dev/null); do kill -9 $p; done; %s netns del %s",
          mh_ip, ns, mh_ip, ns);
}

static void mh_topology_remove(void)
{
    if (getpid() != mh_owner || !mh_made)
        return;
    for (int h = MH_HOSTS - 1; h >= -1; h--)
        mh_ns_remove(mh_ns(h));
    mh_made = 0;
}

/* Namespaces of earlier runs whose process is gone (a run killed with SIGKILL). */
static void mh_sweep_stale(void)
{
    /* Outside any test: no Check assertions here, only the shell. */
    char cmd[64];
    snprintf(cmd, sizeof cmd, "%s netns list", mh_ip);
    FILE *f = popen(cmd, "r");
    if (!f)
        return;
    char line[256], stale[32][80];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < 32) {
        int pid;
        char name[49];
        if (sscanf(line, "rvmh%d-%48s", &pid, name) != 2)
            continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d", pid);
        if (access(path, F_OK) != 0)
            snprintf(stale[n++], sizeof stale[0], "rvmh%d-%s", pid, name);
    }
    pclose(f);
    for (int i = 0; i < n; i++)
        mh_ns_remove(stale[i]);
}

/* The hub's bridge and one veth pair per host; 0, or -1 with *why set. */
static int mh_topology_make(char *why, size_t cap)
{
    if (geteuid() != 0) {
        snprintf(why, cap, "needs root");
        return -1;
    }
    if (access(mh_ip, X_OK) != 0)
        mh_ip = "/sbin/ip";
    if (access(mh_ip, X_OK) != 0) {
        snprintf(why, cap, "no ip command (iproute2)");
        return -1;
    }
    if (mh_sh("command -v iptables && command -v nft") != 0) {
        snprintf(why, cap, "no iptables or nft");
        return -1;
    }
    mh_sweep_stale();
    const char *hub = mh_ns(-1);
    if (mh_sh("%s netns add %s", mh_ip, hub) != 0) {
        snprintf(why, cap, "ip netns add failed (see %s)", mh_log);
        return -1;
    }
    mh_made = 1;
    if (mh_sh("%s -n %s link set lo up && %s -n %s link add br0 type bridge && "
              "%s -n %s link set br0 up", mh_ip, hub, mh_ip, hub, mh_ip, hub) != 0) {
        snprintf(why, cap, "no bridge in a namespace (see %s)", mh_log);
        return -1;
    }
    for (int h = 0; h < MH_HOSTS; h++) {
        const char *ns = mh_ns(h);
        if (mh_sh("%s netns add %s", mh_ip, ns) != 0) {
            snprintf(why, cap, "ip netns add %s failed (see %s)", ns, mh_log);
            return -1;
        }
        mh_made++;
        if (mh_sh("%s -n %s link add v-%s type veth peer name eth0 netns %s && "
                  "%s -n %s link set v-%s master br0 up && "
                  "%s -n %s addr add %s/24 dev eth0 && %s -n %s link set eth0 up && "
                  "%s -n %s link set lo up",
                  mh_ip, hub, mh_hosts[h], ns, mh_ip, hub, mh_hosts[h], mh_ip, ns,
                  mh_addr(h), mh_ip, ns, mh_ip, ns) != 0) {
            snprintf(why, cap, "veth pair for %s failed (see %s)", ns, mh_log);
            return -1;
        }
    }
    /* riverd's host firewall, as deploy/MULTI-HOST.md sets it: every test runs through
     * it, and test_firewall checks that it keeps the others out. */
    const char *rd = mh_ns(MH_RD);
    if (mh_sh("%s netns exec %s nft add table inet river && "
              "%s netns exec %s nft add chain inet river input "
              "'{ type filter hook input priority 0; policy accept; }' && "
              "%s netns exec %s nft add rule inet river input ip saddr %s tcp dport "
              "'{ %d, %d }' accept && "
              "%s netns exec %s nft add rule inet river input ip saddr %s-%s tcp dport %d "
              "accept && "
              "%s netns exec %s nft add rule inet river input tcp dport '{ %d, %d, %d }' drop",
              mh_ip, rd, mh_ip, rd, mh_ip, rd, mh_addr(MH_CL), MH_PORT_CLIENTS, MH_PORT_ADMIN,
              mh_ip, rd, mh_addr(MH_W0), mh_addr(MH_W2), MH_PORT_WORKERS, mh_ip, rd,
              MH_PORT_CLIENTS, MH_PORT_WORKERS, MH_PORT_ADMIN) != 0) {
        snprintf(why, cap, "nft rules in a namespace failed (see %s)", mh_log);
        return -1;
    }
    return 0;
}

/* Cuts (up = 0) or restores host's cable: its port on the hub's bridge. */
static void mh_link(int host, int up)
{
    ck_assert_int_eq(mh_sh("%s -n %s link set v-%s %s", mh_ip, mh_ns(-1), mh_hosts[host],
                           up ? "up" : "down"), 0);
}

/* Moves the calling thread into host's network namespace: the sockets it (and the
 * threads it starts, ZMQ's among them) makes from now on are that host's. */
static void mh_enter(int host)
{
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", mh_ns(host));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
    ck_assert_msg(setns(fd, CLONE_NEWNET) == 0, "setns %s: %s", path, strerror(errno));
    close(fd);
}

/* ---- A delaying TCP relay: a thread in one namespace ---- */

typedef struct mh_chunk {
    struct mh_chunk *next;
    int64_t due_ms;
    size_t len, off;
    char data[];
} mh_chunk_t;

/* One direction of a relayed connection: what was read from `from` and waits for `to`. */
typedef struct mh_dir {
    int from, to;
    mh_chunk_t *head, *tail;
} mh_dir_t;

#define MH_RELAY_CONNS 8

typedef struct mh_relay {
    int host;               /* where it runs */
    atomic_int delay_ms;    /* each direction; may change while it runs */
    struct sockaddr_in target;
    int listen_fd;
    mh_dir_t dirs[MH_RELAY_CONNS][2];
    atomic_int stop, started;
    pthread_t th;
} mh_relay_t;

static void mh_dir_close(mh_dir_t *d)
{
    while (d->head) {
        mh_chunk_t *c = d->head;
        d->head = c->next;
        free(c);
    }
    d->tail = NULL;
}

static void mh_conn_close(mh_dir_t *pair)
{
    close(pair[0].from);
    close(pair[0].to);
    mh_dir_close(&pair[0]);
    mh_dir_close(&pair[1]);
    pair[0].from = pair[0].to = pair[1].from = pair[1].to = -1;
}

/* Reads what is there into a chunk due delay_ms from now; 0 at the end of the stream. */
static int mh_dir_read(mh_relay_t *r, mh_dir_t *d)
{
    mh_chunk_t *c = malloc(sizeof *c + 65536);
    if (!c)
        return -1;
    ssize_t n = read(d->from, c->data, 65536);
    if (n <= 0) {
        free(c);
        return n < 0 && (errno == EAGAIN || errno == EINTR) ? 1 : 0;
    }
    c->next = NULL;
    c->len = (size_t)n;
    c->off = 0;
    c->due_ms = clock_now_ms() + atomic_load(&r->delay_ms);
    if (d->tail)
        d->tail->next = c;
    else
        d->head = c;
    d->tail = c;
    return 1;
}

/* Writes the chunks whose time has come; -1 when the other side is gone. */
static int mh_dir_flush(mh_dir_t *d, int64_t now)
{
    while (d->head && d->head->due_ms <= now) {
        mh_chunk_t *c = d->head;
        ssize_t n = write(d->to, c->data + c->off, c->len - c->off);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        c->off += (size_t)n;
        if (c->off < c->len)
            return 0;
        d->head = c->next;
        if (!d->head)
            d->tail = NULL;
        free(c);
    }
    return 0;
}

static void *mh_relay_run(void *arg)
{
    mh_relay_t *r = arg;
    for (int i = 0; i < MH_RELAY_CONNS; i++)
        for (int k = 0; k < 2; k++)
            r->dirs[i][k].from = r->dirs[i][k].to = -1;
    while (!atomic_load(&r->stop)) {
        struct pollfd p[1 + 2 * MH_RELAY_CONNS];
        int n = 0;
        p[n++] = (struct pollfd){.fd = r->listen_fd, .events = POLLIN};
        int64_t now = clock_now_ms(), wait = 20;
        for (int i = 0; i < MH_RELAY_CONNS; i++)
            for (int k = 0; k < 2; k++) {
                mh_dir_t *d = &r->dirs[i][k];
                p[n++] = (struct pollfd){.fd = d->from, .events = POLLIN};
                if (d->head && d->head->due_ms - now < wait)
                    wait = d->head->due_ms - now;
            }
        if (poll(p, (nfds_t)n, (int)(wait > 0 ? wait : 0)) < 0 && errno != EINTR)
            break;
        if (p[0].revents & POLLIN) {
            int in = accept4(r->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            int slot = -1;
            for (int i = 0; i < MH_RELAY_CONNS && slot < 0; i++)
                if (r->dirs[i][0].from < 0)
                    slot = i;
            int out = in >= 0 && slot >= 0 ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)
                                           : -1;
            /* The connection to the target is made blocking, then both ends go
             * non-blocking: a refused target closes the accepted one at once. */
            if (out >= 0 && connect(out, (struct sockaddr *)&r->target, sizeof r->target) == 0 &&
                fcntl(out, F_SETFL, O_NONBLOCK) == 0) {
                int one = 1;
                setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                r->dirs[slot][0] = (mh_dir_t){.from = in, .to = out};
                r->dirs[slot][1] = (mh_dir_t){.from = out, .to = in};
            } else {
                if (out >= 0)
                    close(out);
                if (in >= 0)
                    close(in);
            }
        }
        now = clock_now_ms();
        for (int i = 0, at = 1; i < MH_RELAY_CONNS; i++) {
            int gone = 0;
            for (int k = 0; k < 2; k++, at++) {
                mh_dir_t *d = &r->dirs[i][k];
                if (d->from < 0)
                    continue;
                if ((p[at].revents & (POLLIN | POLLHUP | POLLERR)) && mh_dir_read(r, d) <= 0)
                    gone = 1;
                if (mh_dir_flush(d, now) < 0)
                    gone = 1;
            }
            if (gone && r->dirs[i][0].from >= 0)
                mh_conn_close(r->dirs[i]);
        }
    }
    for (int i = 0; i < MH_RELAY_CONNS; i++)
        if (r->dirs[i][0].from >= 0)
            mh_conn_close(r->dirs[i]);
    close(r->listen_fd);
    return NULL;
}

/* The relay thread enters host's namespace, listens on 127.0.0.1:port there and passes
 * every connection on to target:tport, delay_ms later in each direction. */
static void *mh_relay_main(void *arg)
{
    mh_relay_t *r = arg;
    mh_enter(r->host);
    atomic_store(&r->started, 1);
    return mh_relay_run(r);
}

static void mh_relay_start(mh_relay_t *r, int host, int port, int target_host, int tport,
                           int delay_ms)
{
    memset(r, 0, sizeof *r);
    r->host = host;
    atomic_store(&r->delay_ms, delay_ms);
    r->target.sin_family = AF_INET;
    r->target.sin_port = htons((uint16_t)tport);
    ck_assert_int_eq(inet_pton(AF_INET, mh_addr(target_host), &r->target.sin_addr), 1);
    /* The listening socket is made here, in host's namespace, so that it exists before the
     * worker connects; the thread then lives there too. */
    mh_enter(host);
    r->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(r->listen_fd, 0);
    int one = 1;
    setsockopt(r->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(r->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(r->listen_fd, 8), 0);
    mh_enter(MH_CL);
    ck_assert_int_eq(pthread_create(&r->th, NULL, mh_relay_main, r), 0);
}

static void mh_relay_stop(mh_relay_t *r)
{
    atomic_store(&r->stop, 1);
    pthread_join(r->th, NULL);
}

/* ---- Keys, riverd and workers ---- */

typedef struct mh_srv {
    cluster_t c;
    char keys[320];
    river_keys_t client_keys;
    char client_secret[400], server_public[400];
} mh_srv_t;

static void mh_keygen(const char *name, const char *dir)
{
    char *out;
    char *argv[] = {(char *)test_bin("riverctl"), "keygen", (char *)name, "--dir", (char *)dir,
                    NULL};
    ck_assert_msg(test_capture(argv, NULL, 1, &out) == 0, "keygen %s: %s", name, out);
    free(out);
}

/* Key pairs for riverd, one per worker name, one client (also the operator); riverd's
 * directories get the public halves, as deploy/MULTI-HOST.md distributes them. */
static void mh_keys(mh_srv_t *s, const char *const *workers, int n)
{
    ck_assert_int_eq(mh_sh("mkdir -p %s/clients %s/workers %s/admin %s/wk %s/cl", s->keys,
                           s->keys, s->keys, s->c.dir, s->c.dir), 0);
    mh_keygen("riverd", s->keys);
    char d[400];
    for (int i = 0; i < n; i++) {
        snprintf(d, sizeof d, "%s/wk", s->c.dir);
        mh_keygen(workers[i], d);
        ck_assert_int_eq(mh_sh("cp %s/%s.key %s/workers/", d, workers[i], s->keys), 0);
    }
    snprintf(d, sizeof d, "%s/cl", s->c.dir);
    mh_keygen("client", d);
    ck_assert_int_eq(mh_sh("cp %s/client.key %s/clients/ && cp %s/client.key %s/admin/", d,
                           s->keys, d, s->keys), 0);
    snprintf(s->client_secret, sizeof s->client_secret, "%.300s/client.key_secret", d);
    snprintf(s->server_public, sizeof s->server_public, "%.300s/riverd.key", s->keys);
    s->client_keys.secret_key = s->client_secret;
    s->client_keys.server_key = s->server_public;
}

/* The argv prefix that runs a program in host's namespace; lives as long as the test. */
static const char *const *mh_wrap(int host)
{
    static const char *wrap[MH_HOSTS][5];
    const char **w = wrap[host];
    w[0] = mh_ip;
    w[1] = "netns";
    w[2] = "exec";
    w[3] = mh_ns(host);
    w[4] = NULL;
    return w;
}

/* riverd in its namespace, on tcp:// with CURVE, with short heartbeats and `extra`. */
static void mh_riverd_start(mh_srv_t *s, const char *name, int heartbeat_ms, int liveness,
                            const char *extra)
{
    /* Each test has a directory of its own under the run's (which the first made). */
    char dir[256], clients[64], workers[64], admin[64], bind[64];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    ck_assert_int_eq(mh_sh("mkdir -p %s", dir), 0);
    snprintf(clients, sizeof clients, "tcp://%s:%d", mh_addr(MH_RD), MH_PORT_CLIENTS);
    snprintf(workers, sizeof workers, "tcp://%s:%d", mh_addr(MH_RD), MH_PORT_WORKERS);
    snprintf(admin, sizeof admin, "tcp://%s:%d", mh_addr(MH_RD), MH_PORT_ADMIN);
    snprintf(bind, sizeof bind, "tcp://*:%d", MH_PORT_WORKERS);
    char y[4096];
    snprintf(y, sizeof y,
             "log_level: info\n"
             "auth:\n  mode: curve\n  secret_key: keys/riverd.key_secret\n"
             "  clients: keys/clients\n  workers: keys/workers\n  admin: keys/admin\n%s",
             extra ? extra : "");
    cluster_opts_t o = {.dir = dir, .clients = clients, .workers = workers, .admin = admin,
                        .workers_bind = bind, .heartbeat_ms = heartbeat_ms,
                        .liveness = liveness, .extra = y, .keys = &s->client_keys,
                        .admin_ms = 2000, .wrap = mh_wrap(MH_RD)};
    cluster_init(&s->c, &o);
    snprintf(s->keys, sizeof s->keys, "%s/keys", s->c.dir);
    static const char *const names[] = {"w0", "w1", "w2"};
    mh_keys(s, names, 3);
    cluster_write_config(&s->c, &o);
    cluster_riverd_start(&s->c, NULL);
}

/* Worker `id` (its key is wk/<key>.key_secret) on `host`, connecting to `endpoint` (NULL:
 * riverd's worker endpoint); returns its index. */
static int mh_worker_start(mh_srv_t *s, const char *id, const char *key, int host,
                           const char *model, const char *endpoint, const char *extra)
{
    char name[64], y[2048];
    snprintf(name, sizeof name, "%s-%s", id, mh_hosts[host]);
    snprintf(y, sizeof y,
             "reconnect:\n  backoff_max: 2s\n"
             "auth:\n  mode: curve\n  secret_key: wk/%s.key_secret\n"
             "  server_key: keys/riverd.key\n%s",
             key, extra ? extra : "");
    cluster_worker_opts_t w = {.model = model, .endpoint = endpoint, .log_level = "info",
                               .yaml = y, .cfg_name = name, .log_name = name,
                               .wrap = mh_wrap(host)};
    return cluster_worker_start(&s->c, id, &w);
}

static void mh_wait_ready(const mh_srv_t *s, int n, int ms)
{
    streams_wait_ready(s->c.admin, &s->client_keys, n, ms, s->c.dir);
}

/* A counter of riverd's metrics: the value on the line that starts with `name `. */
static long mh_metric(const mh_srv_t *s, const char *name)
{
    return streams_metric(s->c.admin, &s->client_keys, name);
}

static long mh_worker_tokens(const mh_srv_t *s, const char *id)
{
    char name[128];
    snprintf(name, sizeof name, "river_worker_tokens_total{worker=\"%s\"}", id);
    return mh_metric(s, name);
}

/* riverctl (the real program, run from the clients' host) with the client's keys. */
static int mh_riverctl(const mh_srv_t *s, char **out, const char *a1, const char *a2,
                       const char *a3)
{
    char env_ep[400], env_key[480], env_srv[480];
    snprintf(env_ep, sizeof env_ep, "RIVER_ADMIN=%s", s->c.admin);
    snprintf(env_key, sizeof env_key, "RIVER_KEY=%s", s->client_secret);
    snprintf(env_srv, sizeof env_srv, "RIVER_SERVER_KEY=%s", s->server_public);
    const char *env[] = {env_ep, env_key, env_srv, NULL};
    char *argv[] = {(char *)test_bin("riverctl"), (char *)a1, (char *)a2, (char *)a3, NULL};
    return test_capture(argv, env, 1, out);
}

/* Every test runs in its own process (Check's fork mode) in the clients' namespace, on a
 * clean network whatever the one before did or left when it failed: every cable in, no
 * packet-loss rules on any host (riverd's firewall stays: the topology set it). */
static void mh_setup(void)
{
    for (int h = 0; h < MH_HOSTS; h++) {
        mh_link(h, 1);
        ck_assert_int_eq(mh_sh("%s netns exec %s iptables -F", mh_ip, mh_ns(h)), 0);
    }
    mh_enter(MH_CL);
}

/* ---- Tests ---- */

/* A worker's cable is pulled mid-stream. riverd hears nothing from it for `liveness`
 * heartbeats, declares it dead and continues its streams on the other worker from the
 * tokens the clients have. The cable goes back in: what the cut-off worker had sent
 * before it gave riverd up (its kernel retransmits it once the link is back) reaches
 * riverd as messages of a dead connection, which riverd drops and answers with
 * Reconnect; the worker introduces itself again and serves. */
START_TEST(test_link_cut)
{
    enum { N = 8, TOKENS = 160 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(MH_SLOW_MODEL, TOKENS, want);
    mh_srv_t s = {0};
    mh_riverd_start(&s, "link_cut", 200, 3, NULL);
    mh_worker_start(&s, "w0", "w0", MH_W0, MH_SLOW_MODEL, NULL, NULL);
    mh_worker_start(&s, "w1", "w1", MH_W1, MH_SLOW_MODEL, NULL, NULL);
    mh_wait_ready(&s, 2, 60000);

    streams_load_t l;
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 30000);
    long at_cut = streams_load_wait(&l, N * 16);
    mh_link(MH_W0, 0);
    double t_cut = clock_now_s();
    double dead_after = cluster_wait_state(&s.c, "w0", "dead", 10000);
    ck_assert_msg(dead_after >= 0, "riverd did not declare the cut-off worker dead");
    /* Down long enough for the worker to give riverd up too and to try again. */
    test_sleep_ms(2500);
    mh_link(MH_W0, 1);
    double t_up = clock_now_s();
    int complete = streams_load_finish(&l, "link cut");
    /* The other worker answered throughout, so every stream could finish there. */
    ck_assert_int_eq(complete, N);
    streams_load_free(&l);
    ck_assert_int_ge(mh_metric(&s, "river_worker_deaths_total"), 1);
    ck_assert_int_ge(mh_metric(&s, "river_requests_redispatched_total"), 1);
    ck_assert_msg(cluster_wait_state(&s.c, "w0", "ready", 20000) >= 0,
                  "the worker did not come back after its link did");
    double back = clock_now_s() - t_up;
    long stale = mh_metric(&s, "river_worker_stale_messages_total");
    /* The entry is new (the old one was forgotten), and so is its token count. */
    long w0_before = mh_worker_tokens(&s, "w0");

    /* Back, it serves again, exactly. */
    streams_expect_t short_want[STREAMS_N_PROMPTS];
    streams_expect_all(MH_SLOW_MODEL, 40, short_want);
    streams_load_start(&l, s.c.clients, &s.client_keys, 6, short_want, 40, 30000);
    ck_assert_int_eq(streams_load_finish(&l, "after the link came back"), 6);
    streams_load_free(&l);
    ck_assert_int_gt(mh_worker_tokens(&s, "w0"), w0_before);
    printf("multihost: w0's link cut after %ld of %d tokens: dead after %.2f s, link back "
           "after %.2f s, %d of %d streams complete and exact, %ld stale messages dropped, "
           "w0 ready again %.2f s after its link\n",
           at_cut, N * TOKENS, dead_after, t_up - t_cut, complete, N, stale, back);
    cluster_stop(&s.c);
}
END_TEST

/* 20% of the packets on a worker's link are lost in each direction (iptables' statistic
 * match in its namespace) and each direction is 50 ms late (a relay in its namespace):
 * TCP retransmits, streams are slower, and every one completes exactly. The same load
 * runs first over the same relay without loss or delay, for comparison. Heartbeats are
 * generous here, as a deployment over such a link would set them. */
START_TEST(test_loss_delay)
{
    enum { N = 8, TOKENS = 160 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(MH_SLOW_MODEL, TOKENS, want);
    mh_srv_t s = {0};
    mh_riverd_start(&s, "loss_delay", 500, 10, NULL);
    mh_relay_t relay;
    mh_relay_start(&relay, MH_W0, MH_PORT_RELAY, MH_RD, MH_PORT_WORKERS, 0);
    char relayed[64];
    snprintf(relayed, sizeof relayed, "tcp://127.0.0.1:%d", MH_PORT_RELAY);
    mh_worker_start(&s, "w0", "w0", MH_W0, MH_SLOW_MODEL, relayed, NULL);
    mh_worker_start(&s, "w1", "w1", MH_W1, MH_SLOW_MODEL, NULL, NULL);
    mh_wait_ready(&s, 2, 60000);
    char addr[64];
    cluster_worker_state(&s.c, "w0", addr, sizeof addr);
    ck_assert_str_eq(addr, mh_addr(MH_W0));

    double t0 = clock_now_s();
    streams_load_t l;
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 60000);
    ck_assert_int_eq(streams_load_finish(&l, "clean link"), N);
    streams_load_free(&l);
    double clean = clock_now_s() - t0;
    long w0_clean = mh_worker_tokens(&s, "w0");

    const char *ns = mh_ns(MH_W0);
    ck_assert_int_eq(mh_sh("%s netns exec %s iptables -A INPUT -i eth0 -m statistic --mode random "
                           "--probability 0.2 -j DROP && "
                           "%s netns exec %s iptables -A OUTPUT -o eth0 -m statistic --mode "
                           "random --probability 0.2 -j DROP",
                           mh_ip, ns, mh_ip, ns), 0);
    atomic_store(&relay.delay_ms, 50);
    t0 = clock_now_s();
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 60000);
    int complete = streams_load_finish(&l, "loss and delay");
    double lossy = clock_now_s() - t0;
    ck_assert_int_eq(complete, N);
    streams_load_free(&l);
    long w0_tokens = mh_worker_tokens(&s, "w0") - w0_clean;
    ck_assert_msg(w0_tokens > 0, "nothing went over the lossy link");
    char *out;
    char *argv[] = {(char *)mh_ip, "netns", "exec", (char *)ns, "iptables", "-nvxL", NULL};
    ck_assert_int_eq(test_capture(argv, NULL, 1, &out), 0);
    long dropped = 0;
    for (char *p = out; (p = strstr(p, "statistic")); p++) {
        /* Each rule's line starts with its packet count. */
        char *line = p;
        while (line > out && line[-1] != '\n')
            line--;
        long pk = 0;
        if (sscanf(line, " %ld", &pk) == 1)
            dropped += pk;
    }
    free(out);
    ck_assert_msg(dropped > 0, "no packet was dropped");
    ck_assert_int_eq(mh_sh("%s netns exec %s iptables -F", mh_ip, ns), 0);
    mh_relay_stop(&relay);
    printf("multihost: 20%% loss and 50 ms delay each way on w0's link: %d of %d streams "
           "complete and exact in %.2f s (%.2f s on the clean link), %ld tokens over the "
           "lossy link, %ld packets dropped\n",
           complete, N, lossy, clean, w0_tokens, dropped);
    cluster_stop(&s.c);
}
END_TEST

/* riverd's own cable is pulled: nothing tells the clients, so the client library's
 * heartbeats must: every request in flight ends with UNAVAILABLE within the documented
 * time. The workers give riverd up after `liveness` heartbeats and try again with a
 * capped, jittered back-off (reconnect.backoff_max, 2 s here): when the cable is back,
 * both are ready within that cap (and the handshake), and serve. */
START_TEST(test_riverd_cut)
{
    enum { N = 6, TOKENS = 160 };
    const double cap_s = 2.0, liveness_s = 0.6;
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(MH_SLOW_MODEL, TOKENS, want);
    mh_srv_t s = {0};
    mh_riverd_start(&s, "riverd_cut", 200, 3, NULL);
    mh_worker_start(&s, "w0", "w0", MH_W0, MH_SLOW_MODEL, NULL, NULL);
    mh_worker_start(&s, "w1", "w1", MH_W1, MH_SLOW_MODEL, NULL, NULL);
    mh_wait_ready(&s, 2, 60000);

    streams_load_t l;
    /* No silence limit of the library's own: only its view of the connection ends them. */
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 0);
    long at_cut = streams_load_wait(&l, N * 16);
    mh_link(MH_RD, 0);
    double t_cut = clock_now_s();
    int complete = streams_load_finish(&l, "riverd's link cut");
    double slowest = 0;
    int unavailable = 0;
    for (int i = 0; i < N; i++) {
        if (l.st[i].end != RIVER_EVENT_ERROR)
            continue;
        ck_assert_msg(l.st[i].code == RIVER_CODE_UNAVAILABLE, "stream %d: %s: %s", i,
                      river_code_name(l.st[i].code), l.st[i].msg);
        unavailable++;
        if (l.st[i].end_at - t_cut > slowest)
            slowest = l.st[i].end_at - t_cut;
    }
    ck_assert_int_ge(unavailable, 1);
    ck_assert_msg(slowest <= MH_CLIENT_GIVES_UP_S + 3.0,
                  "a client took %.2f s to give riverd up", slowest);
    streams_load_free(&l);

    mh_link(MH_RD, 1);
    double t_up = clock_now_s();
    mh_wait_ready(&s, 2, 30000);
    double rejoin = clock_now_s() - t_up;
    /* The cap, the worker's liveness window of its last attempt, and the handshake. */
    ck_assert_msg(rejoin <= cap_s + liveness_s + 2.0, "workers back %.2f s after riverd, "
                  "past the %.1f s cap", rejoin, cap_s);
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 30000);
    ck_assert_int_eq(streams_load_finish(&l, "after riverd's link came back"), N);
    streams_load_free(&l);
    printf("multihost: riverd's link cut after %ld of %d tokens: %d of %d requests ended with "
           "UNAVAILABLE within %.2f s (%d had completed); link back after %.2f s, both "
           "workers ready %.2f s later (cap %.1f s), %d new streams exact\n",
           at_cut, N * TOKENS, unavailable, N, slowest, complete, t_up - t_cut, rejoin, cap_s,
           N);
    cluster_stop(&s.c);
}
END_TEST

/* A worker host dies mid-stream (the process is killed) and the worker is started again,
 * with the same key and name, on another host: riverd continues the streams on the other
 * worker, takes the new connection as the same worker coming back, lists it at its new
 * address (riverctl workers) and sends it work. */
START_TEST(test_moved)
{
    enum { N = 6, TOKENS = 160 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(MH_SLOW_MODEL, TOKENS, want);
    mh_srv_t s = {0};
    mh_riverd_start(&s, "moved", 200, 3, NULL);
    int w0 = mh_worker_start(&s, "w0", "w0", MH_W0, MH_SLOW_MODEL, NULL, NULL);
    mh_worker_start(&s, "w1", "w1", MH_W1, MH_SLOW_MODEL, NULL, NULL);
    mh_wait_ready(&s, 2, 60000);
    char addr[64];
    cluster_worker_state(&s.c, "w0", addr, sizeof addr);
    ck_assert_str_eq(addr, mh_addr(MH_W0));

    streams_load_t l;
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 30000);
    long at_kill = streams_load_wait(&l, N * 16);
    test_kill(&s.c.wk[w0].pid, SIGKILL);
    int moved = mh_worker_start(&s, "w0", "w0", MH_W2, MH_SLOW_MODEL, NULL, NULL);
    ck_assert_int_eq(streams_load_finish(&l, "worker moved"), N);
    streams_load_free(&l);
    double t0 = clock_now_s();
    ck_assert_msg(cluster_wait_state(&s.c, "w0", "ready", 30000) >= 0, "w0 not back");
    char *out;
    ck_assert_int_eq(mh_riverctl(&s, &out, "--output", "json", "workers"), 0);
    json_error_t je;
    json_t *arr = json_loads(out, 0, &je);
    ck_assert_msg(json_is_array(arr), "riverctl workers: %s", out);
    const char *shown = NULL;
    size_t i;
    json_t *w;
    json_array_foreach(arr, i, w) {
        if (!strcmp(json_string_value(json_object_get(w, "id")), "w0") &&
            !strcmp(json_string_value(json_object_get(w, "state")), "ready"))
            shown = json_string_value(json_object_get(w, "address"));
    }
    ck_assert_msg(shown && !strcmp(shown, mh_addr(MH_W2)), "riverctl workers: %s", out);
    json_decref(arr);
    free(out);
    /* The text table too. */
    ck_assert_int_eq(mh_riverctl(&s, &out, "workers", NULL, NULL), 0);
    ck_assert_msg(strstr(out, "ADDRESS") && strstr(out, mh_addr(MH_W2)), "%s", out);
    printf("multihost: riverctl workers after the move:\n%s", out);
    free(out);

    long before = mh_worker_tokens(&s, "w0");
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, 40, 30000);
    streams_expect_t short_want[STREAMS_N_PROMPTS];
    streams_expect_all(MH_SLOW_MODEL, 40, short_want);
    for (int k = 0; k < N; k++)
        l.st[k].want = &short_want[k % STREAMS_N_PROMPTS];
    ck_assert_int_eq(streams_load_finish(&l, "after the move"), N);
    streams_load_free(&l);
    ck_assert_int_gt(mh_worker_tokens(&s, "w0"), before);
    printf("multihost: w0 killed on %s after %ld of %d tokens and started on %s: every "
           "stream exact, w0 listed at %s %.2f s later and serving\n",
           mh_addr(MH_W0), at_kill, N * TOKENS, mh_addr(MH_W2), mh_addr(MH_W2),
           clock_now_s() - t0);
    (void)moved;
    cluster_stop(&s.c);
}
END_TEST

/* An operator drains a worker under load (riverctl drain, from the clients' host) and
 * starts its replacement on a spare host: the drained worker finishes what it has and
 * leaves, the replacement takes new work, and nothing is lost. */
START_TEST(test_drain_replace)
{
    enum { N = 8, TOKENS = 160 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(MH_SLOW_MODEL, TOKENS, want);
    mh_srv_t s = {0};
    mh_riverd_start(&s, "drain_replace", 200, 3, "drain_timeout: 60s\n");
    int w0 = mh_worker_start(&s, "w0", "w0", MH_W0, MH_SLOW_MODEL, NULL, NULL);
    mh_worker_start(&s, "w1", "w1", MH_W1, MH_SLOW_MODEL, NULL, NULL);
    mh_wait_ready(&s, 2, 60000);

    streams_load_t l;
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 60000);
    long at_drain = streams_load_wait(&l, N * 16);
    char *out;
    ck_assert_msg(mh_riverctl(&s, &out, "drain", "w0", NULL) == 0, "riverctl drain: %s", out);
    free(out);
    mh_worker_start(&s, "w2", "w2", MH_W2, MH_SLOW_MODEL, NULL, NULL);
    /* More load while the drain runs: it goes to w1 and the replacement. */
    streams_load_t more;
    streams_load_start(&more, s.c.clients, &s.client_keys, 4, want, TOKENS, 60000);
    int complete = streams_load_finish(&l, "drain under load");
    complete += streams_load_finish(&more, "during the drain");
    ck_assert_int_eq(complete, N + 4);
    streams_load_free(&l);
    streams_load_free(&more);
    /* The drained worker exits by itself once it has nothing left. */
    int code = test_wait_code(s.c.wk[w0].pid, 30000);
    ck_assert_msg(code == 0, "the drained worker ended with %d", code);
    s.c.wk[w0].pid = 0;
    ck_assert_msg(cluster_wait_state(&s.c, "w2", "ready", 30000) >= 0, "replacement not ready");
    long w2_before = mh_worker_tokens(&s, "w2");
    streams_load_start(&l, s.c.clients, &s.client_keys, N, want, TOKENS, 60000);
    ck_assert_int_eq(streams_load_finish(&l, "after the replacement"), N);
    streams_load_free(&l);
    ck_assert_int_gt(mh_worker_tokens(&s, "w2"), w2_before);
    printf("multihost: w0 drained after %ld of %d tokens with 4 more streams arriving, its "
           "replacement w2 started: %d of %d streams complete and exact, none lost\n",
           at_drain, N * TOKENS, complete, N + 4);
    cluster_stop(&s.c);
}
END_TEST

/* Whether a TCP connection from `from` to riverd's host on port is accepted within ms. */
static int mh_can_connect(int from, int port, int ms)
{
    mh_enter(from);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    mh_enter(MH_CL);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    ck_assert_int_eq(inet_pton(AF_INET, mh_addr(MH_RD), &a.sin_addr), 1);
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    int ok = rc == 0;
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof err;
        ok = poll(&p, 1, ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
             err == 0;
    }
    close(fd);
    return ok;
}

/* riverd's host firewall of deploy/MULTI-HOST.md (the topology sets it, every case runs
 * through it): the client and admin ports take the clients' host only, the worker port
 * the worker hosts only. */
START_TEST(test_firewall)
{
    mh_srv_t s = {0};
    mh_riverd_start(&s, "firewall", 200, 3, NULL);
    double until = clock_now_s() + 20;
    while (!mh_can_connect(MH_CL, MH_PORT_CLIENTS, 1000) && clock_now_s() < until)
        test_sleep_ms(100);
    ck_assert_msg(mh_can_connect(MH_CL, MH_PORT_CLIENTS, 2000), "clients' host refused");
    ck_assert(mh_can_connect(MH_CL, MH_PORT_ADMIN, 2000));
    ck_assert(mh_can_connect(MH_W0, MH_PORT_WORKERS, 2000));
    ck_assert(mh_can_connect(MH_W2, MH_PORT_WORKERS, 2000));
    ck_assert_msg(!mh_can_connect(MH_W0, MH_PORT_CLIENTS, 1000), "a worker host reached 5555");
    ck_assert_msg(!mh_can_connect(MH_W1, MH_PORT_ADMIN, 1000), "a worker host reached 5557");
    ck_assert_msg(!mh_can_connect(MH_CL, MH_PORT_WORKERS, 1000), "the clients reached 5556");
    printf("multihost: riverd's firewall: clients and admin from %s only, workers from %s-%s "
           "only\n", mh_addr(MH_CL), mh_addr(MH_W0), mh_addr(MH_W2));
    cluster_stop(&s.c);
}
END_TEST

static Suite *multihost_suite(void)
{
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"link_cut", test_link_cut},   {"loss_delay", test_loss_delay},
        {"riverd_cut", test_riverd_cut}, {"moved", test_moved},
        {"drain_replace", test_drain_replace}, {"firewall", test_firewall},
    };
    Suite *s = suite_create("multihost");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 240);
        tcase_add_checked_fixture(tc, mh_setup, NULL);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

static void mh_on_signal(int sig)
{
    mh_topology_remove();
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(void)
{
    mh_owner = getpid();
    snprintf(mh_prefix, sizeof mh_prefix, "rvmh%d", (int)getpid());
    /* Not test_tmpdir(): its checks may only run inside a test. */
    snprintf(mh_log, sizeof mh_log, "/tmp/river-multihost-%d.log", (int)getpid());
    char why[1024] = "";
    atexit(mh_topology_remove);
    signal(SIGINT, mh_on_signal);
    signal(SIGTERM, mh_on_signal);
    if (mh_topology_make(why, sizeof why) < 0) {
        mh_topology_remove();
        TEST_SKIP(TEST_SKIP_MISSING, "multihost: cannot make network namespaces: %s", why);
        /* An empty run, so that the runner still reads Check's count line. */
        SRunner *none = srunner_create(suite_create("multihost"));
        srunner_run_all(none, CK_NORMAL);
        srunner_free(none);
        return 0;
    }
    SRunner *sr = srunner_create(multihost_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    mh_topology_remove();
    if (failed == 0)
        unlink(mh_log);
    else
        printf("multihost: what ip and iptables said is in %s\n", mh_log);
    return failed == 0 ? 0 : 1;
}
