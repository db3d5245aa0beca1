// llama.cpp, through node-llama-cpp, as River's outside reference for GGUF files.
//
//   node ref.mjs ref --model FILE.gguf --prompts FILE [--steps N] [--threads T]
//     For each prompt (one a line of FILE, taken as is), llama.cpp's tokenization without
//     special tokens (`ids`) and with BOS prepended as the file's add_bos says
//     (`ids_bos`), then N greedy steps from ids_bos: at each step the argmax of the raw
//     last-position logits (`greedy`) and the top-1 minus top-2 logit margin (`margin`).
//     No stop on EOS, no sampler: the logits are llama.cpp's own.
//
//   node ref.mjs bench --model FILE.gguf [--tokens N] [--threads T] [--runs R]
//                      [--prompt TEXT]
//     Decode speed: R runs (after a warm-up of 4 tokens) of N greedy tokens after the prompt, each
//     timed from the first generated token to the last, so prefill is not in it; prints
//     every run's tok/s and their median.
//
//   node ref.mjs prefill --model FILE.gguf [--tokens N] [--threads T] [--runs R]
//     Prefill speed: R runs (after a 32-token warm-up) evaluating a prompt of N tokens (the
//     default prompt's tokens repeated, after BOS) into an empty context without generating,
//     in batches of 512 as llama-bench's micro-batch; prints every run's tok/s and their
//     median (prefill_tok_s).
//
//   node ref.mjs serve --model FILE.gguf --prompts FILE --clients N [--rounds R]
//                      [--tokens G] [--threads T]
//     Batched serving, the llama.cpp side of `make bench-serving`: one context with N
//     sequences, N clients each streaming one greedy completion of G tokens at a time (no
//     stop on EOS), the sequences evaluated together as node-llama-cpp batches them. A round
//     starts every client's request at once and ends with the last one; a warm-up round of
//     short requests comes first. FILE holds N * (R + 1) prompts, one a line: the warm-up
//     round's, then each round's, client by client (scripts/bench-serving.mjs reads the same
//     file and prints the same lines). Prints per measured round "round R WALL_S TOKENS" and
//     per request "ttft SECONDS", from the request's start (tokenizing its prompt) to its
//     first generated token.
//
//   node ref.mjs corrupt --model IN.gguf --out OUT.gguf --tensor NAME
//     Copies IN to OUT with every value of the F32 tensor NAME negated: a file that a
//     correct implementation must decode differently, so the suite can show it fails.
//
// ref and bench print one JSON object on stdout; ref's says how many tensors of each ggml
// type the file holds (`tensor_types`), so a suite can tell which block layouts it covered,
// and every mode's says which of llama.cpp's CPU builds ran (`cpu_variant`: haswell,
// skylakex, zen4, ...; the prebuilt libraries hold one a set of instruction sets and ggml
// loads the best the processor can run from the directory node-llama-cpp points it at, so a
// copy of that directory holding fewer makes it run a lower level's). node-llama-cpp is found through RIVER_NPM_DIR (the
// npm prefix scripts/node-env.sh installs into) or Node's own resolution.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

function usage(msg) {
    if (msg) process.stderr.write(`ref.mjs: ${msg}\n`);
    process.stderr.write(
        "usage: node ref.mjs ref --model FILE.gguf --prompts FILE [--steps N] [--threads T]\n" +
        "       node ref.mjs bench --model FILE.gguf [--tokens N] [--threads T] [--runs R] [--prompt TEXT]\n" +
        "       node ref.mjs prefill --model FILE.gguf [--tokens N] [--threads T] [--runs R]\n" +
        "       node ref.mjs serve --model FILE.gguf --prompts FILE --clients N [--rounds R] [--tokens G] [--threads T]\n" +
        "       node ref.mjs corrupt --model IN.gguf --out OUT.gguf --tensor NAME\n");
    process.exit(2);
}

function parseArgs(argv) {
    const mode = argv[0];
    if (!["ref", "bench", "prefill", "serve", "corrupt"].includes(mode)) usage(mode ? `unknown mode '${mode}'` : "no mode");
    const o = { mode, steps: 16, threads: 1, tokens: 64, runs: 5, prompt: "Once upon a time",
                clients: 1, rounds: 3 };
    const ints = new Set(["steps", "threads", "tokens", "runs", "clients", "rounds"]);
    for (let i = 1; i < argv.length; i++) {
        const m = /^--([a-z]+)$/.exec(argv[i]);
        if (!m || i + 1 >= argv.length) usage(`unknown or incomplete option '${argv[i]}'`);
        const key = m[1], val = argv[++i];
        if (!["model", "prompts", "prompt", "out", "tensor", ...ints].includes(key)) usage(`unknown option '--${key}'`);
        if (ints.has(key)) {
            const n = Number(val);
            if (!Number.isInteger(n) || n < 1) usage(`--${key} wants a positive integer, not '${val}'`);
            o[key] = n;
        } else {
            o[key] = val;
        }
    }
    if (!o.model) usage("--model is required");
    if ((mode === "ref" || mode === "serve") && !o.prompts) usage(`${mode} needs --prompts`);
    if (mode === "corrupt" && (!o.out || !o.tensor)) usage("corrupt needs --out and --tensor");
    return o;
}

async function importLlama() {
    const dir = process.env.RIVER_NPM_DIR;
    if (!dir) return import("node-llama-cpp");
    const req = createRequire(path.join(dir, "package.json"));
    return import(pathToFileURL(req.resolve("node-llama-cpp")).href);
}

// The CPU build ggml loaded, read from this process's mappings (Linux): the name in
// libggml-cpu-NAME.so, or null where there is none or no /proc.
function cpuVariant() {
    let maps;
    try {
        maps = readFileSync("/proc/self/maps", "utf8");
    } catch {
        return null;
    }
    const names = new Set([...maps.matchAll(/libggml-cpu-([a-z0-9_]+)\.so/g)].map((m) => m[1]));
    return names.size ? [...names].sort().join(",") : null;
}

function median(xs) {
    const s = [...xs].sort((a, b) => a - b);
    const h = s.length >> 1;
    return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
}

// The top two entries of node-llama-cpp's logits map, which it sorts highest first.
function top2(logits) {
    const it = logits.entries();
    const a = it.next().value, b = it.next().value;
    if (!a || !b) throw new Error("llama.cpp returned fewer than two logits");
    return { id: a[0], margin: a[1] - b[1] };
}

const nextTop2 = { generateNext: { logits: { filter: { tokens: [], includeTop: 2 } } } };

async function greedy(sequence, ids, steps) {
    await sequence.clearHistory();
    const input = ids.map((t, i) => (i === ids.length - 1 ? [t, nextTop2] : t));
    const out = { greedy: [], margin: [] };
    for (let s = 0; s < steps; s++) {
        const res = await sequence.controlledEvaluate(input);
        const last = res[input.length - 1];
        if (!last || !last.next || !last.next.logits)
            throw new Error(`no logits from llama.cpp at step ${s}`);
        const t = top2(last.next.logits);
        out.greedy.push(t.id);
        out.margin.push(Number(t.margin.toPrecision(7)));
        input.length = 0;
        input.push([t.id, nextTop2]);
    }
    return out;
}

async function bench(model, sequence, o) {
    const prompt = model.tokenize(o.prompt);
    if (model.tokens.shouldPrependBosToken) prompt.unshift(model.tokens.bos);
    const once = async (tokens) => {
        await sequence.clearHistory();
        let n = 0, t0 = 0;
        for await (const tok of sequence.evaluate(prompt, { temperature: 0 })) {
            void tok;
            n++;
            if (n === 1) t0 = performance.now();
            if (n >= tokens + 1) break;
        }
        return (n - 1) / ((performance.now() - t0) / 1000);
    };
    await once(Math.min(4, o.tokens)); // warm-up: page the mapped weights in
    const runs = [];
    for (let r = 0; r < o.runs; r++) runs.push(Number((await once(o.tokens)).toFixed(3)));
    return { tokens: o.tokens, prompt_tokens: prompt.length, runs_tok_s: runs,
             decode_tok_s: median(runs) };
}

async function prefill(model, sequence, o) {
    const text = model.tokenize(o.prompt);
    const ids = model.tokens.bos !== undefined ? [model.tokens.bos] : [];
    while (ids.length < o.tokens) ids.push(text[ids.length % text.length]);
    const once = async (tokens) => {
        await sequence.clearHistory();
        const t0 = performance.now();
        await sequence.evaluateWithoutGeneratingNewTokens(tokens);
        return tokens.length / ((performance.now() - t0) / 1000);
    };
    await once(ids.slice(0, 32)); // warm-up: page the mapped weights in
    const runs = [];
    for (let r = 0; r < o.runs; r++) runs.push(Number((await once(ids)).toFixed(3)));
    return { prompt_tokens: ids.length, runs_tok_s: runs, prefill_tok_s: median(runs) };
}

async function serve(model, context, o) {
    const lines = readFileSync(o.prompts, "utf8").split("\n").filter((l) => l.length > 0);
    if (lines.length < o.clients * (o.rounds + 1))
        throw new Error(`${o.prompts}: ${lines.length} prompts, ${o.clients * (o.rounds + 1)} needed`);
    const seqs = Array.from({ length: o.clients }, () => context.getSequence());
    // One request on its own sequence, timed from t0 (the round's start, when every
    // client sends): its prompt tokenized as River's tokenizer does it (BOS as the file
    // says), then greedy tokens, EOS included, until there are n.
    const one = async (sequence, text, n, t0) => {
        const ids = model.tokenize(text);
        if (model.tokens.shouldPrependBosToken) ids.unshift(model.tokens.bos);
        await sequence.clearHistory();
        let got = 0, first = 0;
        for await (const tok of sequence.evaluate(ids, { temperature: 0, yieldEogToken: true })) {
            void tok;
            if (++got === 1) first = performance.now();
            if (got >= n) break;
        }
        return { ttft: first - t0, tokens: got };
    };
    const round = async (r, n) => {
        const t0 = performance.now();
        const res = await Promise.all(seqs.map((s, c) => one(s, lines[r * o.clients + c], n, t0)));
        return { wall: performance.now() - t0, res };
    };
    await round(0, Math.min(8, o.tokens));
    for (let r = 1; r <= o.rounds; r++) {
        const { wall, res } = await round(r, o.tokens);
        const tokens = res.reduce((a, x) => a + x.tokens, 0);
        process.stdout.write(`round ${r} ${(wall / 1000).toFixed(4)} ${tokens}\n`);
        for (const x of res) process.stdout.write(`ttft ${(x.ttft / 1000).toFixed(4)}\n`);
    }
}

// ggml's type numbers (ggml.h's enum ggml_type) for the types a River export writes.
const ggmlTypeNames = { 0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1",
                        8: "Q8_0", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
                        14: "Q6_K", 30: "BF16" };

async function tensorTypes(readGgufFileInfo, file) {
    const info = await readGgufFileInfo(file, { logWarnings: false });
    const counts = {};
    for (const t of info.fullTensorInfo || info.tensorInfo || []) {
        const n = ggmlTypeNames[t.ggmlType] || `type${t.ggmlType}`;
        counts[n] = (counts[n] || 0) + 1;
    }
    return counts;
}

async function corrupt(readGgufFileInfo, o) {
    const info = await readGgufFileInfo(o.model, { logWarnings: false });
    const t = (info.fullTensorInfo || info.tensorInfo || []).find((x) => x.name === o.tensor);
    if (!t) throw new Error(`${o.model}: no tensor '${o.tensor}'`);
    if (t.ggmlType !== 0) throw new Error(`${o.model}: tensor '${o.tensor}' is not F32`);
    const buf = readFileSync(o.model);
    const n = t.dimensions.reduce((a, d) => a * Number(d), 1);
    const f = new Float32Array(buf.buffer, buf.byteOffset + Number(t.fileOffset), n);
    for (let i = 0; i < n; i++) f[i] = -f[i];
    writeFileSync(o.out, buf);
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const { getLlama, LlamaLogLevel, readGgufFileInfo } = await importLlama();
    if (o.mode === "corrupt") return corrupt(readGgufFileInfo, o);
    const llama = await getLlama({ gpu: false, build: "never", progressLogs: false,
                                   logLevel: LlamaLogLevel.error });
    const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0 });
    const result = { model: o.model, threads: o.threads, bos: model.tokens.bos,
                     eos: model.tokens.eos, add_bos: model.tokens.shouldPrependBosToken,
                     cpu_variant: cpuVariant() };
    // Serving's contexts are a short prompt and its completion, each sequence its own
    // (contextSize is per sequence); the batch holds every sequence's prompt at once.
    const nctx = o.mode === "bench" ? 512 : o.mode === "serve" ? 256
               : o.mode === "prefill" ? o.tokens + 16 : 1024;
    const context = await model.createContext({ contextSize: nctx,
                                                 batchSize: o.mode === "serve" || o.mode === "prefill" ? 512 : nctx,
                                                 sequences: o.mode === "serve" ? o.clients : 1,
                                                 threads: { ideal: o.threads, min: o.threads } });
    if (o.mode === "serve") {
        await serve(model, context, o);
        await context.dispose();
        await model.dispose();
        await llama.dispose();
        return;
    }
    const sequence = context.getSequence();
    if (o.mode === "bench") {
        Object.assign(result, await bench(model, sequence, o));
    } else if (o.mode === "prefill") {
        Object.assign(result, await prefill(model, sequence, o));
    } else {
        const lines = readFileSync(o.prompts, "utf8").split("\n").filter((l) => l.length > 0);
        result.tensor_types = await tensorTypes(readGgufFileInfo, o.model);
        result.steps = o.steps;
        result.prompts = [];
        for (const text of lines) {
            const ids = model.tokenize(text, false);
            const ids_bos = result.add_bos ? [model.tokens.bos, ...ids] : [...ids];
            if (ids_bos.length + o.steps > nctx) throw new Error(`prompt '${text}' is too long`);
            result.prompts.push({ prompt: text, ids, ids_bos,
                                  ...(await greedy(sequence, ids_bos, o.steps)) });
        }
    }
    process.stdout.write(JSON.stringify(result) + "\n");
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((e) => {
    process.stderr.write(`ref.mjs: ${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
});
