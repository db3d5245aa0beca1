// The official `openai` npm package, unmodified, against river-gateway serving a tiny random
// model with the Llama 3 vocabulary and the Llama 3.1 chat template: tool calls (tool_choice
// required and named, enforced by the grammar; streamed deltas against the whole
// response), response_format json_schema and json_object, logprobs, and the constraint
// holding on the exit path and in lossless mode. ajv (from npm, at test time) validates
// every output against its schema. Run by scripts/test-openai.sh.
//
// A random model closes only values a grammar bounds: the schemas use enums, booleans,
// bounded arrays, nested objects, anyOf and $ref. Temperature 1 over 128k tokens makes
// every seed a different walk through the grammar.
import { OpenAI, require, baseURL, apiKey, check, expect, finish } from './harness.mjs';

const Ajv2020 = require('ajv/dist/2020');
const model = process.env.RIVER_MODEL || 'tiny';
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const ajv = new Ajv2020({ strict: false });
const SEEDS = Number(process.env.RIVER_TOOL_SEEDS || 100);
// Runs f(seed) for seeds 0..n-1, eight at a time (the worker's max_seqs).
async function seeds(n, f) {
    const out = [];
    for (let i = 0; i < n; i += 8) {
        const batch = [];
        for (let s = i; s < Math.min(n, i + 8); s++) batch.push(f(s));
        out.push(...(await Promise.all(batch)));
    }
    return out;
}

const weather = {
    type: 'object',
    properties: {
        city: { enum: ['Paris', 'Oslo', 'Lima'] },
        unit: { enum: ['celsius', 'fahrenheit'] },
        days: { type: 'array', items: { $ref: '#/$defs/day' }, maxItems: 3 },
        detailed: { type: 'boolean' },
        where: {
            type: 'object',
            properties: { country: { enum: ['FR', 'NO', 'PE'] } },
            required: ['country'],
            additionalProperties: false,
        },
        alerts: { anyOf: [{ type: 'null' }, { enum: [1, 2, 3] }] },
    },
    required: ['city', 'unit', 'days', 'detailed', 'where', 'alerts'],
    additionalProperties: false,
    $defs: { day: { enum: ['mon', 'tue', 'wed'] } },
};
const clock = {
    type: 'object',
    properties: { zone: { enum: ['UTC', 'CET'] }, seconds: { type: 'boolean' } },
    required: ['zone', 'seconds'],
    additionalProperties: false,
};
const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather.', parameters: weather } },
    { type: 'function', function: { name: 'get_time', description: 'Time.', parameters: clock } },
];
const validators = { get_weather: ajv.compile(weather), get_time: ajv.compile(clock) };
const messages = [{ role: 'user', content: 'What is the weather in Paris, and the time?' }];

function checkCall(call, what) {
    expect(call.type === 'function', `${what}: type function, got ${call.type}`);
    expect(typeof call.id === 'string' && call.id.length > 0, `${what}: an id`);
    const v = validators[call.function.name];
    expect(v, `${what}: a known function, got ${call.function.name}`);
    let args;
    try {
        args = JSON.parse(call.function.arguments);
    } catch (e) {
        throw new Error(`${what}: arguments are not JSON: ${call.function.arguments}`);
    }
    expect(v(args), `${what}: arguments valid for ${call.function.name}: ` +
           `${call.function.arguments} ${JSON.stringify(v.errors)}`);
}

await check(`tool_choice required: ${SEEDS} seeds at temperature 1 call a tool validly`, async () => {
    const names = {};
    await seeds(SEEDS, async (seed) => {
        const r = await client.chat.completions.create({
            model, messages, tools, tool_choice: 'required', temperature: 1, seed,
            max_tokens: 256,
        });
        const c = r.choices[0];
        expect(c.finish_reason === 'tool_calls', `seed ${seed}: finish tool_calls, got ` +
               `${c.finish_reason}: ${JSON.stringify(c.message)}`);
        expect(c.message.tool_calls && c.message.tool_calls.length >= 1,
               `seed ${seed}: a tool call in ${JSON.stringify(c.message)}`);
        for (const call of c.message.tool_calls) {
            checkCall(call, `seed ${seed}`);
            names[call.function.name] = (names[call.function.name] || 0) + 1;
        }
    });
    console.log(`# calls by name: ${JSON.stringify(names)}`);
});

await check('tool_choice naming a function calls that one', async () => {
    await seeds(16, async (seed) => {
        const r = await client.chat.completions.create({
            model, messages, tools, temperature: 1, seed, max_tokens: 256,
            tool_choice: { type: 'function', function: { name: 'get_time' } },
        });
        const calls = r.choices[0].message.tool_calls;
        expect(calls && calls.length === 1 && calls[0].function.name === 'get_time',
               `seed ${seed}: one get_time call, got ${JSON.stringify(r.choices[0].message)}`);
        checkCall(calls[0], `seed ${seed}`);
    });
});

await check('a streamed tool call assembled from deltas equals the whole one', async () => {
    for (let seed = 0; seed < 6; seed++) {
        const req = { model, messages, tools, tool_choice: 'required', temperature: 1, seed, max_tokens: 256 };
        const whole = (await client.chat.completions.create(req)).choices[0];
        const stream = await client.chat.completions.create({ ...req, stream: true });
        const calls = [];
        let finish = null, content = '';
        for await (const chunk of stream) {
            const c = chunk.choices[0];
            if (!c) continue;
            if (c.finish_reason) finish = c.finish_reason;
            if (c.delta.content) content += c.delta.content;
            for (const d of c.delta.tool_calls || []) {
                if (!calls[d.index]) calls[d.index] = { id: d.id, type: d.type, function: { name: '', arguments: '' } };
                const t = calls[d.index];
                if (d.function && d.function.name) t.function.name += d.function.name;
                if (d.function && d.function.arguments) t.function.arguments += d.function.arguments;
            }
        }
        expect(finish === whole.finish_reason, `seed ${seed}: finish ${finish} vs ${whole.finish_reason}`);
        expect(calls.length === whole.message.tool_calls.length,
               `seed ${seed}: ${calls.length} streamed calls vs ${whole.message.tool_calls.length}`);
        calls.forEach((c, i) => {
            const w = whole.message.tool_calls[i];
            expect(c.function.name === w.function.name && c.function.arguments === w.function.arguments,
                   `seed ${seed}: streamed ${JSON.stringify(c.function)} vs whole ${JSON.stringify(w.function)}`);
            checkCall(c, `seed ${seed} streamed`);
        });
        expect(content === (whole.message.content || ''), `seed ${seed}: content ${JSON.stringify(content)}`);
    }
});

await check('a tool result goes back in as a role tool message', async () => {
    const first = (await client.chat.completions.create({
        model, messages, tools, tool_choice: 'required', temperature: 0, max_tokens: 256,
    })).choices[0].message;
    const r = await client.chat.completions.create({
        model, tools, temperature: 0, max_tokens: 8,
        messages: [...messages, first,
                   { role: 'tool', tool_call_id: first.tool_calls[0].id, content: '{"temp": 21}' }],
    });
    expect(r.choices[0].finish_reason, 'an answer after the tool result');
});

await check(`response_format json_schema: ${SEEDS} seeds that finish validate`, async () => {
    let finished = 0, cut = 0;
    await seeds(SEEDS, async (seed) => {
        const r = await client.chat.completions.create({
            model, messages, temperature: 1, seed, max_tokens: 256,
            response_format: { type: 'json_schema', json_schema: { name: 'weather', schema: weather, strict: true } },
        });
        const c = r.choices[0];
        if (c.finish_reason === 'length') {
            cut++; // max_tokens cut the value: documented as finish_reason length
            return;
        }
        expect(c.finish_reason === 'stop', `seed ${seed}: finish ${c.finish_reason}`);
        finished++;
        let v;
        try {
            v = JSON.parse(c.message.content);
        } catch (e) {
            throw new Error(`seed ${seed}: not JSON: ${c.message.content}`);
        }
        expect(validators.get_weather(v), `seed ${seed}: valid: ${c.message.content} ` +
               `${JSON.stringify(validators.get_weather.errors)}`);
    });
    console.log(`# ${finished} finished, ${cut} cut by max_tokens`);
    expect(finished >= SEEDS * 0.9, `at least 90% finish within 256 tokens, got ${finished}`);
});

await check('response_format json_object on /v1/completions gives a JSON object', async () => {
    await seeds(16, async (seed) => {
        const r = await client.completions.create({
            model, prompt: 'JSON:', temperature: 1, seed, max_tokens: 256,
            response_format: { type: 'json_object' },
        });
        const c = r.choices[0];
        if (c.finish_reason === 'length') return;
        const v = JSON.parse(c.text);
        expect(v && typeof v === 'object' && !Array.isArray(v), `seed ${seed}: an object: ${c.text}`);
    });
});

await check('a bad schema is a 400 naming its path', async () => {
    try {
        await client.chat.completions.create({
            model, messages, max_tokens: 8,
            response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
                type: 'object', properties: { a: { type: 'integr' } } } } },
        });
    } catch (e) {
        expect(e instanceof OpenAI.BadRequestError, `BadRequestError, got ${e}`);
        expect(e.param === 'response_format.json_schema.schema', `its param, got ${e.param}`);
        expect(/properties\/a/.test(e.message), `the path in ${e.message}`);
        return;
    }
    throw new Error('no error');
});

await check('river.grammar constrains a completion; a bad one is a 400 naming its line', async () => {
    const grammar = 'root ::= "answer: " ("yes" | "no") "."';
    await seeds(8, async (seed) => {
        const r = await client.completions.create({
            model, prompt: 'Q:', temperature: 1, seed, max_tokens: 32, river: { grammar },
        });
        expect(/^answer: (yes|no)\.$/.test(r.choices[0].text) && r.choices[0].finish_reason === 'stop',
               `seed ${seed}: ${JSON.stringify(r.choices[0])}`);
    });
    try {
        await client.completions.create({ model, prompt: 'Q:', max_tokens: 4,
                                          river: { grammar: 'root ::= "a" (' } });
    } catch (e) {
        expect(e instanceof OpenAI.BadRequestError && e.param === 'river.grammar', `${e}`);
        expect(/line 1/.test(e.message), `the line in ${e.message}`);
        return;
    }
    throw new Error('no error');
});

await check('chat logprobs: greedy takes the top one, sampled tokens are listed consistently', async () => {
    const greedy = await client.chat.completions.create({
        model, messages, temperature: 0, max_tokens: 16, logprobs: true, top_logprobs: 5,
    });
    const content = greedy.choices[0].logprobs.content;
    expect(content.length > 0, 'entries');
    let text = '';
    for (const e of content) {
        expect(e.top_logprobs.length === 5, `5 top entries, got ${e.top_logprobs.length}`);
        expect(e.top_logprobs[0].token === e.token && e.top_logprobs[0].logprob === e.logprob,
               `greedy is the top entry: ${JSON.stringify(e)}`);
        expect(e.logprob <= 0, `logprob <= 0: ${e.logprob}`);
        text += Buffer.from(e.bytes).toString('latin1');
    }
    expect(Buffer.from(text, 'latin1').toString('utf8') === greedy.choices[0].message.content,
           'the tokens\' bytes spell the content');
    // Sampled under a schema, where few tokens are allowed at most positions, so that
    // sampled tokens are often among the top 20 (without one, a random model's 128k
    // tokens are near uniform).
    const sampled = await client.chat.completions.create({
        model, messages, temperature: 1, seed: 3, max_tokens: 64, logprobs: true, top_logprobs: 20,
        response_format: { type: 'json_schema', json_schema: { name: 'weather', schema: weather } },
    });
    let listed = 0;
    for (const e of sampled.choices[0].logprobs.content) {
        const t = e.top_logprobs.find((x) => x.token === e.token && x.bytes.join() === e.bytes.join());
        if (t) {
            listed++;
            expect(t.logprob === e.logprob, `its entry's logprob: ${JSON.stringify(e)}`);
        }
        for (let i = 1; i < e.top_logprobs.length; i++)
            expect(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob, 'sorted');
    }
    expect(listed > 0, 'some sampled token in its top 20');
    // Streamed, the entries arrive with their chunks and add up to the same list.
    const stream = await client.chat.completions.create({
        model, messages, temperature: 0, max_tokens: 16, logprobs: true, top_logprobs: 5, stream: true,
    });
    const streamed = [];
    for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (c && c.logprobs && c.logprobs.content) streamed.push(...c.logprobs.content);
    }
    expect(JSON.stringify(streamed) === JSON.stringify(content), 'streamed entries equal the whole ones');
});

await check('completions logprobs N', async () => {
    const r = await client.completions.create({
        model, prompt: 'Hello', temperature: 0, max_tokens: 8, logprobs: 3,
    });
    const lp = r.choices[0].logprobs;
    expect(lp.tokens.length === lp.token_logprobs.length && lp.tokens.length === lp.top_logprobs.length &&
           lp.tokens.length === lp.text_offset.length && lp.tokens.length > 0, JSON.stringify(lp));
    lp.tokens.forEach((t, i) => {
        expect(Object.keys(lp.top_logprobs[i]).length <= 3, 'at most 3 top entries');
        expect(lp.top_logprobs[i][t] === lp.token_logprobs[i], `greedy token ${t} is listed with its logprob`);
    });
});

const schemaFormat = { type: 'json_schema', json_schema: { name: 'weather', schema: weather, strict: true } };
// The worker's rule is cosine (a request may change its threshold, not its rule): tau 0
// sends every token onto the river after the first layer. tests/test_constrain.c covers the
// fixed rule in the engine.
await check('the schema holds on the exit path and in lossless mode', async () => {
    for (const river of [{ tau: 0 }, { tau: 0.5 }, { lossless: true }]) {
        await seeds(16, async (seed) => {
            const r = await client.chat.completions.create({
                model, messages, temperature: 1, seed, max_tokens: 256, response_format: schemaFormat,
                river: { ...river, exit_layers: true },
            });
            const c = r.choices[0];
            if (c.finish_reason === 'length') return;
            const v = JSON.parse(c.message.content);
            expect(validators.get_weather(v), `${JSON.stringify(river)} seed ${seed}: ${c.message.content}`);
        });
    }
});

await check('lossless greedy output equals the constrained backbone\'s', async () => {
    const req = { model, messages, temperature: 0, max_tokens: 256, response_format: schemaFormat };
    const backbone = await client.chat.completions.create({ ...req, river: { policy: 'none' } });
    const lossless = await client.chat.completions.create({ ...req, river: { lossless: true } });
    const exited = await client.chat.completions.create({
        ...req, river: { tau: 0, exit_layers: true } });
    expect(lossless.choices[0].message.content === backbone.choices[0].message.content,
           `lossless ${lossless.choices[0].message.content} vs backbone ${backbone.choices[0].message.content}`);
    expect(exited.choices[0].river.exit_layers.some((l) => l < 2),
           `tokens left the backbone: ${JSON.stringify(exited.choices[0].river)}`);
});

finish();
