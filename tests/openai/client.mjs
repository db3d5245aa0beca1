// The official `openai` npm package, unmodified, against river-gateway: it streams a chat
// completion and a text completion, reads a whole one, lists the models, and must raise its
// own error classes for a bad API key (AuthenticationError), a bad field (BadRequestError)
// and an unknown model (NotFoundError). Run by scripts/test-openai.sh, which installs the
// package under $RIVER_NPM_DIR and starts riverd, a worker and the gateway.
//
// Prints one line per check and then a summary in the form Check's runner prints, which
// scripts/run-tests.sh counts.
import { OpenAI, require, baseURL, apiKey, check, expect, finish } from './harness.mjs';

const model = process.env.RIVER_MODEL || 'stories';
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

const messages = [
    { role: 'system', content: 'You tell stories.' },
    { role: 'user', content: 'Tell me about a dog.' },
];

await check('chat completion, streamed, with usage', async () => {
    const stream = await client.chat.completions.create({
        model, messages, max_tokens: 24, temperature: 0, stream: true,
        stream_options: { include_usage: true },
    });
    let text = '', role = null, finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
        chunks++;
        if (chunk.usage) usage = chunk.usage;
        const c = chunk.choices[0];
        if (!c) continue;
        if (c.delta.role) role = c.delta.role;
        if (c.delta.content) text += c.delta.content;
        if (c.finish_reason) finish = c.finish_reason;
    }
    expect(chunks >= 3, `several chunks, got ${chunks}`);
    expect(role === 'assistant', `role assistant, got ${role}`);
    expect(text.length > 0, 'some text');
    expect(finish === 'stop' || finish === 'length', `a finish reason, got ${finish}`);
    expect(usage && usage.completion_tokens > 0 &&
           usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
           `usage, got ${JSON.stringify(usage)}`);
    // The whole completion is the same text (greedy).
    const whole = await client.chat.completions.create({
        model, messages, max_tokens: 24, temperature: 0,
    });
    expect(whole.choices[0].message.content === text,
           `the same text whole: ${JSON.stringify(whole.choices[0].message.content)} vs ` +
           `${JSON.stringify(text)}`);
});

await check('text completion, streamed', async () => {
    const stream = await client.completions.create({
        model, prompt: 'Once upon a time', max_tokens: 16, temperature: 0, stream: true,
    });
    let text = '', finish = null;
    for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (c && c.text) text += c.text;
        if (c && c.finish_reason) finish = c.finish_reason;
    }
    expect(text.length > 0, 'some text');
    expect(finish === 'stop' || finish === 'length', `a finish reason, got ${finish}`);
});

await check('models.list', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids.includes(model), `${model} in ${JSON.stringify(ids)}`);
});

await check('bad API key raises AuthenticationError', async () => {
    const bad = new OpenAI({ baseURL, apiKey: 'sk-not-a-key', maxRetries: 0 });
    try {
        await bad.chat.completions.create({ model, messages, max_tokens: 4 });
    } catch (e) {
        expect(e instanceof OpenAI.AuthenticationError, `AuthenticationError, got ${e}`);
        expect(e.status === 401, `status 401, got ${e.status}`);
        return;
    }
    throw new Error('no error');
});

await check('bad field raises BadRequestError naming it', async () => {
    try {
        await client.chat.completions.create({ model, messages, max_tokens: 'ten' });
    } catch (e) {
        expect(e instanceof OpenAI.BadRequestError, `BadRequestError, got ${e}`);
        expect(e.param === 'max_tokens', `param max_tokens, got ${e.param}`);
        return;
    }
    throw new Error('no error');
});

await check('unknown model raises NotFoundError', async () => {
    try {
        await client.completions.create({ model: 'no-such-model', prompt: 'Hi' });
    } catch (e) {
        expect(e instanceof OpenAI.NotFoundError, `NotFoundError, got ${e}`);
        return;
    }
    throw new Error('no error');
});

finish();
