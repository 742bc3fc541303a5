// `llmq serve` driven by the official `openai` npm client, as applications drive it: completions and
// chat completions, streamed and not, usage, and the SDK's error classes for llmq's error objects.
// Greedy completions must be what `llmq run` generates for the same prompt: token ids on the seeded
// default model, text on stories260K where the shared test data has it (chat through a real chat
// template, --chat-template). /metrics must count exactly the tokens these requests reported.
// Started by tests/serve_openai.sh, which installs the pinned package into the build tree:
//   node serve_openai.mjs LLMQ TESTDATA_DIR NODE_PACKAGE_DIR CHAT_TEMPLATE
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const [llmq, testdata, packageDir, chatTemplate] = process.argv.slice(2);
const require = createRequire(join(packageDir, 'package.json'));
const OpenAI = require('openai');

let passed = 0;
let failed = 0;
function check(name, ok, detail = '') {
  if (ok) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}${detail ? ': ' + detail : ''}`);
  }
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// Starts `llmq serve --port 0 ARGS`; resolves with {proc, url} once it prints its listening line.
function startServer(args) {
  const proc = spawn(llmq, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('llmq serve did not start: ' + stderr)), 30000);
    proc.on('exit', (code) => reject(new Error(`llmq serve exited ${code}: ${stderr}`)));
    createInterface({ input: proc.stdout }).on('line', (line) => {
      const m = line.match(/listening on (http:\/\/[^:]+:\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, url: m[1] });
      }
    });
  });
}
async function stopServer(server) {
  const exited = new Promise((resolve) => server.proc.on('exit', (code, signal) => resolve(code ?? signal)));
  server.proc.kill('SIGTERM');
  return exited;
}

// The error a call throws (null when it succeeds).
async function thrown(promise) {
  try {
    await promise;
    return null;
  } catch (e) {
    return e;
  }
}

// A streamed completion's pieces: text (or token ids), finish reasons, the usage chunk.
async function collect(stream, chat) {
  const out = { text: '', ids: [], finish: [], usage: null, roles: [], chunks: 0 };
  for await (const chunk of stream) {
    out.chunks++;
    if (chunk.usage) out.usage = chunk.usage;
    for (const c of chunk.choices) {
      if (chat) {
        if (c.delta.role) out.roles.push(c.delta.role);
        out.text += c.delta.content ?? '';
      } else {
        out.text += c.text ?? '';
      }
      out.ids.push(...(c.token_ids ?? []));
      if (c.finish_reason) out.finish.push(c.finish_reason);
    }
  }
  return out;
}

// The value of a /metrics sample (name and a label text such as finished_reason="stop").
async function metric(url, key, name, label = '') {
  const res = await fetch(url + '/metrics', { headers: { Authorization: `Bearer ${key}` } });
  const text = await res.text();
  for (const line of text.split('\n')) {
    if (line.startsWith(name + '{') && line.includes(label)) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  throw new Error(`no ${name} ${label} in /metrics`);
}

// ---- The default model: token ids in, token ids out; the key required.
async function defaultModel() {
  const key = 'sk-llmq-test';
  const server = await startServer(['--model', 'default', '--api-key', key, '--max-num-seqs', '4']);
  const client = new OpenAI({ baseURL: server.url + '/v1', apiKey: key, maxRetries: 0, timeout: 60000 });
  let promptTokens = 0;
  let completionTokens = 0;
  try {
    const models = await client.models.list();
    check('models.list names the served model', same(models.data.map((m) => m.id), ['default']));

    // `llmq run --prompt-ids "5 9"` adds BOS (1): the same prompt as [1, 5, 9]. -n counts positions.
    const maxTokens = 12;
    const want = execFileSync(llmq, ['run', '--model', 'default', '--prompt-ids', '5 9', '-n', String(3 + maxTokens + 4),
      '-t', '0', '--ids', '--ignore-eos'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
      .trim().split(/\s+/).map(Number).slice(0, maxTokens);
    const c = await client.completions.create({ model: 'default', prompt: [1, 5, 9], max_tokens: maxTokens, temperature: 0 });
    check('greedy completion: the token ids llmq run generates', same(c.choices[0].token_ids, want),
      `${JSON.stringify(c.choices[0].token_ids)} vs ${JSON.stringify(want)}`);
    check('completion: object, finish_reason length, usage', c.object === 'text_completion' &&
      c.choices[0].finish_reason === 'length' && c.usage.prompt_tokens === 3 &&
      c.usage.completion_tokens === maxTokens && c.usage.total_tokens === 3 + maxTokens, JSON.stringify(c));
    promptTokens += c.usage.prompt_tokens;
    completionTokens += c.usage.completion_tokens;

    const s = await collect(await client.completions.create({ model: 'default', prompt: [1, 5, 9], max_tokens: maxTokens,
      temperature: 0, stream: true, stream_options: { include_usage: true } }), false);
    check('streamed: the same token ids, one finish_reason, a usage chunk', same(s.ids, want) &&
      same(s.finish, ['length']) && s.usage && s.usage.completion_tokens === maxTokens && s.usage.prompt_tokens === 3,
      JSON.stringify(s));
    promptTokens += 3;
    completionTokens += s.ids.length;

    // Sampled with a seed: the same seed gives the same tokens, streamed or not.
    const a = await client.completions.create({ model: 'default', prompt: [1, 7], max_tokens: 8, temperature: 0.9, seed: 42 });
    const b = await collect(await client.completions.create({ model: 'default', prompt: [1, 7], max_tokens: 8,
      temperature: 0.9, seed: 42, stream: true }), false);
    check('a seed gives the same sampled tokens streamed and not', same(a.choices[0].token_ids, b.ids) && b.ids.length === 8);
    promptTokens += 4;
    completionTokens += 16;

    const wrongKey = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'sk-wrong', maxRetries: 0 });
    let e = await thrown(wrongKey.completions.create({ model: 'default', prompt: [1], max_tokens: 1 }));
    check('a wrong key: AuthenticationError (401, invalid_api_key)', e instanceof OpenAI.AuthenticationError &&
      e.status === 401 && e.code === 'invalid_api_key', String(e));
    e = await thrown(wrongKey.models.list());
    check('models.list with a wrong key: AuthenticationError', e instanceof OpenAI.AuthenticationError, String(e));
    e = await thrown(client.completions.create({ model: 'gpt-4', prompt: [1], max_tokens: 1 }));
    check('an unknown model: NotFoundError (404, model_not_found)', e instanceof OpenAI.NotFoundError &&
      e.status === 404 && e.code === 'model_not_found' && /gpt-4/.test(e.message), String(e));
    e = await thrown(client.completions.create({ model: 'gpt-4', prompt: [1], max_tokens: 1, stream: true }));
    check('an unknown model, streamed: NotFoundError before any chunk', e instanceof OpenAI.NotFoundError, String(e));
    e = await thrown(client.completions.create({ model: 'default', prompt: [1], max_tokens: 0 }));
    check('max_tokens 0: BadRequestError naming the param', e instanceof OpenAI.BadRequestError && e.status === 400 &&
      e.param === 'max_tokens' && e.type === 'invalid_request_error', String(e));
    e = await thrown(client.completions.create({ model: 'default', prompt: [1], n: 2 }));
    check('n 2 (not implemented): BadRequestError naming n', e instanceof OpenAI.BadRequestError && e.param === 'n', String(e));
    e = await thrown(client.completions.create({ model: 'default', prompt: Array(1100).fill(3), max_tokens: 1 }));
    check('a prompt past the context: BadRequestError (context_length_exceeded)', e instanceof OpenAI.BadRequestError &&
      e.code === 'context_length_exceeded', String(e));
    e = await thrown(client.chat.completions.create({ model: 'default', messages: [{ role: 'user', content: 'hi' }] }));
    check('chat on a model without a tokenizer: BadRequestError', e instanceof OpenAI.BadRequestError, String(e));

    // /metrics: exactly the tokens the answered requests reported, nothing left running or held.
    check('/metrics with a wrong key: 401', (await fetch(server.url + '/metrics')).status === 401);
    check('/metrics counts the prompt tokens reported', await metric(server.url, key, 'llmq:prompt_tokens_total') === promptTokens);
    check('/metrics counts the completion tokens reported',
      await metric(server.url, key, 'llmq:generation_tokens_total') === completionTokens);
    const ended = await metric(server.url, key, 'llmq:request_success_total', 'finished_reason="length"');
    const aborted = await metric(server.url, key, 'llmq:request_success_total', 'finished_reason="abort"');
    check('/metrics: the 4 answered requests ended by length, none aborted', ended === 4 && aborted === 0, `${ended}, ${aborted}`);
    check('/metrics: no KV block held, nothing running',
      await metric(server.url, key, 'llmq:kv_cache_blocks_used') === 0 &&
      await metric(server.url, key, 'llmq:num_requests_running') === 0);
  } finally {
    check('SIGTERM: llmq serve exits 0', (await stopServer(server)) === 0);
  }
}

// ---- stories260K: text in, text out; chat through a chat template.
async function stories(model) {
  const server = await startServer(['--model', model, '--served-model-name', 'stories', '--max-num-seqs', '4',
    '--chat-template', chatTemplate]);
  const client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  try {
    const prompt = 'Once upon a time';
    const run = execFileSync(llmq, ['run', '--model', model, '--prompt', prompt, '-n', '64', '-t', '0'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
    const c = await client.completions.create({ model: 'stories', prompt, max_tokens: 40, temperature: 0 });
    const text = c.choices[0].text;
    check('greedy completion is the text llmq run prints', text.length > 20 && run.startsWith(prompt + text),
      `${JSON.stringify(text)} vs ${JSON.stringify(run)}`);
    const s = await collect(await client.completions.create({ model: 'stories', prompt, max_tokens: 40, temperature: 0,
      stream: true, stream_options: { include_usage: true } }), false);
    check('streamed text is the whole text, usage equal', s.text === text && same(s.usage, c.usage) &&
      same(s.finish, [c.choices[0].finish_reason]), JSON.stringify([s, c]));
    const st = await client.completions.create({ model: 'stories', prompt, max_tokens: 40, temperature: 0, stop: ['.'] });
    check('a stop string cuts before itself', st.choices[0].finish_reason === 'stop' &&
      !st.choices[0].text.includes('.') && text.startsWith(st.choices[0].text), JSON.stringify(st.choices[0]));

    const messages = [{ role: 'system', content: 'You tell short stories.' }, { role: 'user', content: 'Tell me about a cat.' }];
    const chat = await client.chat.completions.create({ model: 'stories', messages, max_tokens: 24, temperature: 0 });
    const m = chat.choices[0];
    check('chat: an assistant message, usage adds up', chat.object === 'chat.completion' && m.message.role === 'assistant' &&
      typeof m.message.content === 'string' && m.message.content.length > 0 &&
      chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens &&
      chat.usage.prompt_tokens > 10 && (m.finish_reason === 'length') === (chat.usage.completion_tokens === 24),
      JSON.stringify(chat));
    const cs = await collect(await client.chat.completions.create({ model: 'stories', messages, max_tokens: 24, temperature: 0,
      stream: true, stream_options: { include_usage: true } }), true);
    check('chat streamed: the role once first, the same content and usage', same(cs.roles, ['assistant']) &&
      cs.text === m.message.content && same(cs.usage, chat.usage) && same(cs.finish, [m.finish_reason]), JSON.stringify(cs));
    const e = await thrown(client.chat.completions.create({ model: 'stories', messages: [{ role: 'wizard', content: 'x' }] }));
    check('chat with an unknown role: BadRequestError', e instanceof OpenAI.BadRequestError && e.status === 400, String(e));
  } finally {
    check('SIGTERM: llmq serve (stories260K) exits 0', (await stopServer(server)) === 0);
  }
}

try {
  await defaultModel();
  const model = join(testdata, '..', 'models', 'stories260K.bin');
  if (existsSync(model)) await stories(model);
  else console.log(`skip the stories260K part (text and chat): ${model} absent`);
} catch (e) {
  check('the test ran to its end', false, e.stack);
}
console.log(`serve_openai: ${passed} passed, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
