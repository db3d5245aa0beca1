/* river-worker's configuration schema: every key of its file, its type, default and what
 * it does (tables over code; common/config.h). The exit rules' and aggregations' names are
 * common/exit_names.h's, the device names the backends' (kernels/backend.h). */
#include "workers/config.h"

#include <stddef.h>

#include "common/err.h"
#include "common/exit_names.h"
#include "engine/exit.h"
#include "engine/generate.h"
#include "kernels/backend.h"

static const char *const config__roles[] = {"full", "river", "backbone", NULL};
static const char *const config__exit_modes[] = {"lossy", "lossless", NULL};
/* In the order of config_weights_t. */
static const char *const config__weights[] = {"copy", "mapped", NULL};
/* In the order of pair_transport_kind_t (workers/pair_transport.h). */
static const char *const config__pair_transports[] = {"auto", "zmq", "nccl", "p2p", NULL};

/* A device name as kernels/backend.h reads it. Whether this build has the CUDA backend is
 * the backend's to say when the worker opens it, so "cuda" passes here either way. */
static int config__check_device(const char *v)
{
    backend_kind_t kind;
    int index;
    int e = backend_parse_device(v, &kind, &index);
    return e == 0 || e == RIVER_EUNSUPPORTED ? 0 : 1;
}

#define WK(...) CONFIG_KEY(config_worker_t, __VA_ARGS__)
static const config_key_t config__worker_keys[] = {
    WK("riverd", CONFIG_STRING, riverd, 0, 0, "tcp://127.0.0.1:5556",
       "riverd's worker endpoint, which this worker connects to."),
    WK("id", CONFIG_STRING, id, 0, 0, "",
       "Name of this worker in riverd's table and logs; empty: host name and process id."),
    CONFIG_ENUM_KEY(config_worker_t, "role", role, config__roles, "full",
                 "full runs the whole model; river and backbone are the two halves of a "
                 "split pair (see split)."),
    WK("model", CONFIG_STRING, model, 0, 0, "",
       "Model to serve: a Hugging Face directory (config.json, safetensors), a GGUF file "
       "(its tokenizer inside it) or a llama2.c .bin file."),
    WK("tokenizer", CONFIG_STRING, tokenizer, 0, 0, "",
       "Tokenizer file; empty: the one beside the model."),
    WK("river", CONFIG_STRING, river, 0, 0, "",
       "Exit River file (the 4-bit copy of the deep layers); empty: none, so no early "
       "exit."),
    WK("routers", CONFIG_STRING, routers, 0, 0, "",
       "TIDE router file, needed by exit.rule router; empty: none."),
    {.name = "device", .type = CONFIG_STRING, .offset = offsetof(config_worker_t, device),
     .def = "cpu", .check = config__check_device, .expect = backend_device_forms,
     .doc = "Where the engine runs: cpu, or cuda:N for GPU N (cuda = cuda:0; needs a build "
            "with the CUDA backend); opaque is the test backend that proves the engine "
            "never touches device memory."},
    WK("threads", CONFIG_INT, threads, 0, 1024, "0",
       "CPU threads for the forward pass; 0: one per core."),
    CONFIG_ENUM_KEY(config_worker_t, "weights", weights, config__weights, "copy",
                    "On the CPU: copy, each matrix of 2 MiB or more copied into huge pages "
                    "at start (decode reads those 12-14 % faster than the checkpoint's "
                    "pages; the copies are this process's own memory), or mapped, read in "
                    "the mapped checkpoint, whose page cache other processes of the host "
                    "share. A GPU copies every weight either way."),
    WK("max_batch_rows", CONFIG_INT, max_batch_rows, 1, 65536, "256",
       "Rows in one forward batch: one per decoding sequence plus prefill chunks. A chunk "
       "is cut to the rows left, so below prefill_chunk a prompt prefills in smaller "
       "chunks, whose matmuls run slower on the CPU (64 rows at 0.7-0.8x the rate of "
       "256)."),
    WK("max_seqs", CONFIG_INT, max_seqs, 1, 65536, "16",
       "Sequences running at once; more wait in the worker's queue."),
    WK("prefill_chunk", CONFIG_INT, prefill_chunk, 1, 65536, "256",
       "Prompt tokens one sequence may put into one batch, so that a long prompt does not "
       "stall the others."),
    CONFIG_SECTION_KEY("kv", "The paged KV cache."),
    WK("kv.page_size", CONFIG_INT, kv_page_size, 1, 4096, "16", "Positions per KV page."),
    WK("kv.pages", CONFIG_INT, kv_pages, 0, 1 << 24, "0",
       "Pages in the pool; 0: enough for max_seqs full contexts, at most half the "
       "memory available once the weights are placed (at least one full context)."),
    CONFIG_ENUM_KEY(config_worker_t, "kv.dtype", kv_dtype, gen_kv_dtype_names, "auto",
                    "Element type of the cached K and V. auto: f32 for a backbone of f32 "
                    "weights, f16 for a 16-bit or quantized one (llama.cpp's default); f16 "
                    "and bf16 halve the bytes of f32 (twice the pages for kv.pages 0), q8 "
                    "(symmetric int8, one f32 scale per 32 values; head_dim a multiple of "
                    "32) takes about a quarter. Both workers of a split pair must agree."),
    CONFIG_SECTION_KEY("prefix_cache", "Full KV pages kept after their request ends and reused "
                                    "by requests that start with the same token ids (a "
                                    "chat's earlier turns, a shared system prompt). Greedy "
                                    "tokens do not change; requests with exit policy none "
                                    "reuse only pages the full backbone wrote."),
    WK("prefix_cache.enabled", CONFIG_BOOL, prefix_cache_enabled, 0, 0, "true",
       "Keep and reuse prefix pages; false: every request prefills its whole prompt. Off "
       "anyway for role river (the shared pool of a split pair)."),
    WK("prefix_cache.pages", CONFIG_INT, prefix_cache_pages, 0, 1 << 24, "0",
       "Most KV pages the cache may hold; 0: any the pool has (unused cached pages are "
       "given back before a running request would be preempted)."),
    CONFIG_SECTION_KEY("exit", "Early-exit policy; a request may override rule, tau, theta "
                            "and exit_layer."),
    CONFIG_ENUM_KEY(config_worker_t, "exit.rule", exit_rule, exit_names_rules, "none",
                 "none: the full backbone; cosine: River-LLM's similarity rule (tau); "
                 "router: TIDE's routers (theta); fixed: every token exits after "
                 "exit_layer layers."),
    WK("exit.tau", CONFIG_FLOAT, exit_tau, -1, 1, "0.9",
       "Cosine rule: a token exits when cos(h^l, h^(l+1)) > tau."),
    WK("exit.theta", CONFIG_FLOAT, exit_theta, 0, 1, "0.5",
       "Router rule: a token exits when its router's probability > theta."),
    WK("exit.exit_layer", CONFIG_INT, exit_layer, 0, 4096, "0",
       "Fixed rule: backbone layers every token runs."),
    CONFIG_ENUM_KEY(config_worker_t, "exit.aggregation", exit_aggregation, exit_names_aggs,
                 "min",
                 "min: a decode batch exits when every row passes (the papers); row: each "
                 "row decides and the batch splits where the cost model says it pays."),
    CONFIG_ENUM_KEY(config_worker_t, "exit.mode", exit_mode, config__exit_modes, "lossy",
                 "Requests' default mode (a request may choose its own). lossy: tokens "
                 "that exit take the exit path's output; lossless: the exit path drafts "
                 "up to draft_tokens tokens and the backbone verifies them in one pass, so "
                 "the output is the backbone's (needs a rule other than none and a river)."),
    WK("exit.draft_tokens", CONFIG_INT, exit_draft_tokens, 0, 16, "0",
       "Lossless mode: most draft tokens per verify pass; 0: where exit.mode is lossless, "
       "the count the cost model predicts fastest, from step times measured at start-up "
       "and the acceptance rate seen while serving (elsewhere 4)."),
    CONFIG_SECTION_KEY("split", "The split pair: a river worker and a backbone worker that "
                             "share KV pages (role river or backbone). Both load the same "
                             "model with the same threads, which the pair checks."),
    WK("split.boundary", CONFIG_INT, split_boundary, 0, 4096, "0",
       "Offload boundary: the first backbone layer held by the backbone worker; 0 with "
       "role full."),
    WK("split.peer", CONFIG_STRING, split_peer, 0, 0, "",
       "Address of the other worker of the pair (ipc:// on one host): the backbone worker "
       "binds it, the river worker connects to it."),
    CONFIG_ENUM_KEY(config_worker_t, "split.transport", split_transport,
                    config__pair_transports, "auto",
                    "How hidden states cross between the pair (both workers must agree). "
                    "zmq: as bytes in the pair's messages, from host memory; nccl: NCCL "
                    "send/recv between the two GPUs (CUDA builds); p2p: peer copies through a "
                    "buffer both map; auto: what the backend asks for (zmq on the CPU, nccl "
                    "on GPUs)."),
    CONFIG_SECTION_KEY("reconnect", "What the worker does when riverd (or its split peer) "
                                 "goes silent for heartbeat.liveness intervals."),
    WK("reconnect.backoff_max", CONFIG_DURATION, reconnect_backoff_max_ms, 100, 600000, "5s",
       "Longest wait before connecting again. The wait starts at riverd's heartbeat "
       "interval and doubles after each failed attempt up to this; each wait is drawn at "
       "random between half and all of it, so that workers cut off together do not "
       "reconnect together. A worker is back at most this long (and a handshake) after "
       "riverd is."),
    CONFIG_ENUM_KEY(config_worker_t, "log_level", log_level, config_log_level_names, "info",
                 "Least severe messages logged: error, warn, info or debug."),
    CONFIG_SECTION_KEY("auth", "CurveZMQ on the link to riverd (riverd's auth section); key "
                            "paths are relative to this file's directory."),
    CONFIG_ENUM_KEY(config_worker_t, "auth.mode", auth_mode, config_auth_mode_names, "curve",
                 "curve, or plain: no encryption and no authentication, for a riverd whose "
                 "auth.mode is plain."),
    WK("auth.secret_key", CONFIG_STRING, auth_secret_key, 0, 0, "keys/worker.key_secret",
       "This worker's secret key (mode 0600); its public half, worker.key, goes into "
       "riverd's auth.workers directory."),
    WK("auth.server_key", CONFIG_STRING, auth_server_key, 0, 0, "keys/riverd.key",
       "riverd's public key: the worker talks only to the riverd that holds its secret "
       "half."),
};
#undef WK

/* Lossless mode drafts on the exit path, so it needs one. */
static const char *config__worker_check(const void *cfg, const char **key)
{
    const config_worker_t *w = cfg;
    *key = "exit.mode";
    if (w->exit_mode == CONFIG_EXIT_MODE_LOSSLESS && w->exit_rule == 0)
        return "lossless drafts on the exit path: it needs exit.rule cosine, router or "
               "fixed (exit.rule is none)";
    if (w->exit_mode == CONFIG_EXIT_MODE_LOSSLESS && (!w->river || !w->river[0]))
        return "lossless drafts on the Exit River: it needs a river file (river is empty)";
    return NULL;
}

const config_schema_t config_schema_worker = {"worker", config__worker_keys,
                                              CONFIG_N(config__worker_keys),
                                              sizeof(config_worker_t), config__worker_check};
