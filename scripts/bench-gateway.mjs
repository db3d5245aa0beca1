// One greedy stream through river-gateway, timed by the client: time to first token (from
// sending the request to the first chunk with a token) and decode tokens/s (the tokens
// after the first chunk's, over the time from that chunk to the last). Token counts come
// from the `river.token_ids` extension, so a chunk that carries several tokens counts
// them all. Node's own fetch, no package. Prints one JSON line.
// Usage: node scripts/bench-gateway.mjs URL MODEL PROMPT TOKENS
const [url, model, prompt, n] = process.argv.slice(2);
// Node loads its HTTP client on the first fetch: a request before the timed one keeps that
// (and the connection set-up) out of the figure.
await (await fetch(url + '/health')).text();
const t0 = performance.now();
const res = await fetch(url + '/v1/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({
        model, prompt, max_tokens: Number(n), temperature: 0, stream: true,
        river: { ignore_eos: true, token_ids: true },
    }),
});
if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
const decoder = new TextDecoder();
let buf = '', first = 0, last = 0, firstIds = 0, ids = 0;
for await (const part of res.body) {
    buf += decoder.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev.startsWith('data: {')) continue;
        const o = JSON.parse(ev.slice(6));
        const c = o.choices && o.choices[0];
        const got = c && c.river && c.river.token_ids ? c.river.token_ids.length : 0;
        if (!got) continue;
        const now = performance.now();
        if (!first) {
            first = now;
            firstIds = got;
        }
        last = now;
        ids += got;
    }
}
console.log(JSON.stringify({
    tokens: ids,
    first_token_s: (first - t0) / 1000,
    decode_tok_s: last > first ? (ids - firstIds) / ((last - first) / 1000) : 0,
}));
