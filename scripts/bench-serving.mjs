// Concurrent streaming clients against river-gateway, for `make bench-serving`
// (scripts/bench-serving.sh): CLIENTS clients, each sending one request at a time. A round
// starts every client's request at once and ends when the last stream ends; a warm-up round
// of short requests comes first, so that Node's HTTP client, the connections and the
// worker's first batches are not in the figures. Each request is a text completion of its
// own prompt, streamed (SSE), greedy, GEN tokens without a stop on EOS; tokens are counted
// from the `river.token_ids` extension, so a chunk that carries several counts them all.
// Node's own fetch, no package. tests/llamacpp/ref.mjs serve runs the same rounds on
// llama.cpp and prints the same lines.
//
// Usage: node scripts/bench-serving.mjs URL MODEL PROMPTS CLIENTS ROUNDS GEN
//   PROMPTS is a file of CLIENTS * (ROUNDS + 1) lines: the warm-up round's prompts, then
//   each round's, client by client. Prints, per measured round, "round R WALL_S TOKENS",
//   and per request "ttft SECONDS" (from sending the request to the first token).
import { readFileSync } from 'node:fs';

const [url, model, promptsFile, clientsArg, roundsArg, genArg] = process.argv.slice(2);
const clients = Number(clientsArg), rounds = Number(roundsArg), gen = Number(genArg);
if (!url || !model || !promptsFile || !(clients > 0) || !(rounds > 0) || !(gen > 0)) {
    process.stderr.write('usage: node bench-serving.mjs URL MODEL PROMPTS CLIENTS ROUNDS GEN\n');
    process.exit(2);
}
const prompts = readFileSync(promptsFile, 'utf8').split('\n').filter((l) => l.length > 0);
if (prompts.length < clients * (rounds + 1))
    throw new Error(`${promptsFile}: ${prompts.length} prompts, ${clients * (rounds + 1)} needed`);

// One streamed completion; resolves to its time to first token (ms, from t0) and tokens.
async function stream(prompt, maxTokens) {
    const t0 = performance.now();
    const res = await fetch(url + '/v1/completions', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({
            model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
            river: { ignore_eos: true, token_ids: true },
        }),
    });
    if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
    const decoder = new TextDecoder();
    let buf = '', first = 0, ids = 0;
    for await (const part of res.body) {
        buf += decoder.decode(part, { stream: true });
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
            const ev = buf.slice(0, k);
            buf = buf.slice(k + 2);
            if (!ev.startsWith('data: {')) continue;
            const o = JSON.parse(ev.slice(6));
            if (o.error) throw new Error(`stream error: ${JSON.stringify(o.error)}`);
            const c = o.choices && o.choices[0];
            const got = c && c.river && c.river.token_ids ? c.river.token_ids.length : 0;
            if (got && !first) first = performance.now();
            ids += got;
        }
    }
    if (ids !== maxTokens) throw new Error(`a stream gave ${ids} tokens, not ${maxTokens}`);
    return { ttft: first - t0, tokens: ids };
}

// One round: every client's request at once; the wall time is the last stream's end.
async function round(r, maxTokens) {
    const t0 = performance.now();
    const res = await Promise.all(
        Array.from({ length: clients }, (_, c) => stream(prompts[r * clients + c], maxTokens)));
    return { wall: performance.now() - t0, res };
}

await (await fetch(url + '/health')).text();
await round(0, 8);
for (let r = 1; r <= rounds; r++) {
    const { wall, res } = await round(r, gen);
    const tokens = res.reduce((a, x) => a + x.tokens, 0);
    console.log(`round ${r} ${(wall / 1000).toFixed(4)} ${tokens}`);
    for (const x of res) console.log(`ttft ${(x.ttft / 1000).toFixed(4)}`);
}
