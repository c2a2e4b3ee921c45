// The tiktoken package's GPT-2 encoder (Rust compiled to WASM) on one
// thread over a text file: encode_ordinary, its fastest path (no special
// tokens), the best of REPEATS runs after two warm-up runs. Prints
// name<TAB>bytes<TAB>tokens<TAB>seconds, as tokenizer_throughput --tsv does.
//   node bench/gpt2_reference/tiktoken_speed.js TIKTOKEN_DIR FILE [REPEATS]
const fs = require('fs');
const path = require('path');

const [dir, file, repeatsArg] = process.argv.slice(2);
const repeats = Number(repeatsArg || 5);
const bytes = fs.readFileSync(file);
const text = bytes.toString('utf-8');
const enc = require(path.resolve(dir) + path.sep).get_encoding('gpt2');

let tokens = 0;
for (let i = 0; i < 2; i++) tokens = enc.encode_ordinary(text).length;
let best = Infinity;
for (let r = 0; r < repeats; r++) {
  const t0 = process.hrtime.bigint();
  tokens = enc.encode_ordinary(text).length;
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
enc.free();
process.stdout.write(`tiktoken encode_ordinary\t${bytes.length}\t${tokens}\t${best.toFixed(9)}\n`);
