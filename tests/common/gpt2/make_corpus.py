#!/usr/bin/env python3
"""Writes the mixed text GPT-2's encoder is checked and timed on.

Not a fixture: it is made from this checkout (data/tinyshakespeare.txt and
the repository's own sources) and is the same for the same checkout. At
least 1 MB of blocks, shuffled: English prose, code, numbers, contractions
in every case, whitespace runs (JavaScript's \\s: spaces, tabs, newlines,
NBSP, U+3000, ...), accented Latin, Greek, Cyrillic, Arabic, Hebrew,
Devanagari, Thai, CJK, emoji (ZWJ sequences, skin tones, flags, keycaps)
and characters beyond the BMP. Valid UTF-8 only: the reference encoders
take strings. It avoids what the two references split differently (U+0085
and U+FEFF next to whitespace: tiktoken's \\s is Unicode's White_Space,
gpt-3-encoder's JavaScript's) and characters newer than Unicode 14.

  python3 tests/common/gpt2/make_corpus.py OUT_FILE [--min-bytes N] [--seed S]
"""

import argparse
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]

WORDS = {
    "latin": "café naïve résumé Ærøskøbing straße Größe façade jalapeño "
    "coöperate Ångström señor ĳssel œuvre ﬁnance Łódź Dvořák İstanbul ıi "
    "Tiếng Việt Nguyễn phở đường São Paulo Kraków Reykjavík".split(),
    "decomposed": ["e\u0301te\u0301", "nai\u0308ve", "Ang\u030astro\u0308m",
                   "a\u0300 la carte", "n\u0303", "o\u0328\u0301"],
    "greek": "Ελληνικά καλημέρα κόσμε φιλοσοφία ἀρχή λόγος Ωμέγα ψυχή".split(),
    "cyrillic": "Русский текст привет мир Ёжик щука Україна їжак "
    "Беларусь ў Српски ђ љубав Қазақ".split(),
    "arabic": "العربية مرحبا بالعالم كِتَابٌ السَّلَامُ عَلَيْكُمْ ١٢٣ ٤٥٦".split(),
    "hebrew": "עברית שָׁלוֹם עוֹלָם ספר".split(),
    "devanagari": "हिन्दी नमस्ते दुनिया संस्कृतम् क्षत्रिय ०१२३".split(),
    "thai": "ไทย สวัสดีครับ ภาษาไทย ๑๒๓".split(),
    "cjk": "日本語のテキスト 中文文本 한국어 텍스트 全角スペース 東京都 "
    "漢字かなカナ 简体中文 繁體中文 서울특별시 ｶﾀｶﾅ".split(),
    "beyond_bmp": ["𝐀𝐁𝐂𝐚𝐛𝐜", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𐌰𐌱𐌲", "𠀀𠀁𪜶", "𓀀𓀁𓂀",
                   "𝟘𝟙𝟚", "𐒠𐒡", "𝄞𝄢", "𞤀𞤢"],
    "numbers_unicode": ["½", "¾", "x²", "H₂O", "Ⅻ", "ⅷ", "①②③", "１２３",
                        "٣٤", "۷۸", "໑໒", "〇", "𝟏𝟐"],
}

EMOJI = ["😀", "😂", "🤖", "✨", "❤️", "👍", "👍🏽", "👋🏿", "👩🏽‍💻", "👨‍👩‍👧‍👦",
         "🧑🏻‍🤝‍🧑🏾", "🏳️‍🌈", "🇫🇷", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣", "©️", "☕",
         "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️", "🐈‍⬛", "🫠", "🥲", "⚡", "☀", "☀️"]

SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009",
          "\u202f", "\u205f", "\u1680", "\u2028", "\u2029", "\x0b", "\x0c",
          "\u2002", "\u200a"]

CONTRACTIONS = ["it's", "IT'S", "It'S", "they're", "THEY'RE", "They'Re",
                "we've", "WE'VE", "I'm", "I'M", "you'll", "YOU'LL", "You'Ll",
                "he'd", "HE'D", "don't", "DON'T", "can’t", "it’s", "’s",
                "rock 'n' roll", "'tis", "'twas", "ol'", "dogs'", "''s",
                "'''", "'ll'll", "'llama", "'sup", "'re'", "' s", " 's",
                "ʼs", "`s", "‘s’", "'d've", "y'all'd've", "'S", "'T", "'M",
                "'D", "'LL", "'VE", "'RE", "o'clock", "O'Neil", "'", "'\n"]

PUNCT = list(".,;:!?-()[]{}<>/\\|@#$%^&*+=~\"'`_") + [
    "—", "–", "“", "”", "‘", "’", "«", "»", "…", "©", "®", "™", "°", "±",
    "×", "÷", "→", "⇒", "∀", "∃", "∈", "≤", "≥", "€", "£", "¥", "§", "¶",
    "•", "·", "¿", "¡", "。", "、", "，", "！", "？", "「", "」", "『", "』"]


def prose(rng, size):
    text = (ROOT / "data/tinyshakespeare.txt").read_text(encoding="utf-8")
    blocks = []
    while size > 0:
        n = rng.randint(500, 6000)
        at = rng.randrange(0, len(text) - n)
        blocks.append(text[at:at + n])
        size -= n
    return blocks


def code(rng, size):
    files = []
    for pattern in ("common/*.cc", "common/*.h", "worker/engine/*.cc",
                    "coordinator/*.cc", "kernels/cpu/*.cpp", "scripts/*.sh",
                    "tests/common/*.cc", "bench/*.py", "fuzz/*.cc"):
        files += sorted(ROOT.glob(pattern))
    blocks = []
    for path in files:
        if size <= 0:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        text = text[:rng.randint(2000, 12000)]
        blocks.append(text)
        size -= len(text.encode("utf-8"))
    return blocks


def number(rng):
    kind = rng.randrange(16)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randint(1, 12)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(1, 8)}f}"
    if kind == 2:
        return (f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-"
                f"{rng.randint(1, 28):02d}")
    if kind == 3:
        return f"{rng.randint(1, 28)}/{rng.randint(1, 12)}/{rng.randint(0, 99)}"
    if kind == 4:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
    if kind == 5:
        return f"{rng.randrange(10 ** 9):,}"
    if kind == 6:
        return f"{rng.uniform(0, 10):.3f}e{rng.randint(-30, 30)}"
    if kind == 7:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(30, 1200)))
    if kind == 8:
        return f"0x{rng.randrange(16 ** 8):08X}"
    if kind == 9:
        return ".".join(str(rng.randrange(256)) for _ in range(4))
    if kind == 10:
        return f"+1 ({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"
    if kind == 11:
        return rng.choice(["$", "€", "£", "¥", "-", "+", "#", "~"]) + str(rng.randrange(100000))
    if kind == 12:
        return str(rng.randrange(1000)) + rng.choice(["st", "nd", "rd", "th", "am", "pm", "%", "kg", "_64", "x"])
    if kind == 13:
        return f"v{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 300)}"
    if kind == 14:
        return rng.choice(WORDS["numbers_unicode"])
    return "-" + str(rng.randrange(10 ** rng.randint(1, 6)))


def numbers(rng, size):
    blocks = []
    while size > 0:
        parts = []
        for _ in range(rng.randint(20, 120)):
            parts.append(number(rng))
            parts.append(rng.choice([" ", ", ", "; ", "\n", " | ", "\t", " x ", "  "]))
        block = "".join(parts) + "\n"
        blocks.append(block)
        size -= len(block.encode("utf-8"))
    return blocks


def scripts(rng, size):
    names = [k for k in WORDS if k != "numbers_unicode"]
    blocks = []
    while size > 0:
        parts = []
        for _ in range(rng.randint(20, 200)):
            r = rng.random()
            if r < 0.7:
                parts.append(rng.choice(WORDS[rng.choice(names)]))
            elif r < 0.8:
                parts.append(rng.choice(EMOJI))
            elif r < 0.9:
                parts.append(rng.choice(PUNCT))
            else:
                parts.append(number(rng) if rng.random() < 0.3 else rng.choice(WORDS["numbers_unicode"]))
            parts.append(rng.choice([" ", " ", " ", "", "\n", "\u3000", "\u00a0", "，", "。"]))
        block = "".join(parts) + "\n"
        blocks.append(block)
        size -= len(block.encode("utf-8"))
    return blocks


def emoji(rng, size):
    blocks = []
    while size > 0:
        parts = []
        for _ in range(rng.randint(10, 100)):
            parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))))
            parts.append(rng.choice([" ", "", "!", " wow ", "\n", "  ", "x", "1"]))
        block = "".join(parts) + "\n"
        blocks.append(block)
        size -= len(block.encode("utf-8"))
    return blocks


def whitespace(rng, size):
    after = ["word", "Word", "42", ".", "'s", "日本", "😀", "—", "é", "\n", "", "x"]
    blocks = []
    while size > 0:
        parts = []
        for _ in range(rng.randint(20, 100)):
            run = "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 6)))
            if rng.random() < 0.2:
                run = rng.choice([" ", "\t", "\n", "\u00a0", "\u3000"]) * rng.randint(2, 80)
            parts.append(run)
            parts.append(rng.choice(after))
        # Characters the two references classify differently, where both
        # still split the same: between letters.
        parts.append(rng.choice(["x\u0085y", "bom\ufeffmark"]))
        block = "".join(parts) + rng.choice(["", "   ", "\n\n\n", "\t"])
        blocks.append(block)
        size -= len(block.encode("utf-8"))
    return blocks


def contractions(rng, size):
    blocks = []
    while size > 0:
        parts = []
        for _ in range(rng.randint(10, 60)):
            parts.append(rng.choice(CONTRACTIONS))
            parts.append(rng.choice([" ", " the ", ", ", ". ", "\n", "", "  "]))
        block = "".join(parts) + "\n"
        blocks.append(block)
        size -= len(block.encode("utf-8"))
    return blocks


def misc(rng, size):
    def b64(n):
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        return "".join(rng.choice(alphabet) for _ in range(n)) + "=="

    def uuid():
        h = "".join(rng.choice("0123456789abcdef") for _ in range(32))
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    makers = [
        lambda: f"https://example.com/{rng.choice(['path', 'a/b/c', 'x_y'])}?q={rng.randrange(999)}&r=two#frag",
        lambda: f"user{rng.randrange(99)}@example.org",
        lambda: '{"id": %d, "name": "n%d", "tags": ["a", "b"], "ok": true, "x": null}' % (rng.randrange(10**6), rng.randrange(99)),
        lambda: "| a | b |\n|---|---|\n| 1 | 2 |",
        lambda: '<div class="x">Hello &amp; <b>bye</b></div>',
        lambda: r"\begin{equation} E = mc^2 \frac{a}{b} \end{equation}",
        lambda: b64(rng.randint(20, 400)),
        lambda: uuid(),
        lambda: rng.choice("abcxyz") * rng.randint(50, 600),
        lambda: rng.choice(["!", ".", "=", "-", "*", "#", "~", "_"]) * rng.randint(2, 200),
        lambda: "abcабвαβγ日本123😀x",
        lambda: "<|endoftext|>",
        lambda: "C:\\Windows\\System32\\drivers",
        lambda: "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
        lambda: "a\u0300\u0301\u0302\u0303\u0304 Z\u0351\u0352\u0353",
    ]
    blocks = []
    while size > 0:
        block = " ".join(rng.choice(makers)() for _ in range(rng.randint(5, 30))) + "\n"
        blocks.append(block)
        size -= len(block.encode("utf-8"))
    return blocks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--min-bytes", type=int, default=1_300_000)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    scale = args.min_bytes / 1_300_000
    blocks = []
    for make, size in ((prose, 400_000), (code, 330_000), (numbers, 110_000),
                       (scripts, 230_000), (emoji, 60_000),
                       (whitespace, 70_000), (contractions, 50_000),
                       (misc, 60_000)):
        blocks += make(rng, int(size * scale))
    rng.shuffle(blocks)
    text = "".join(blocks)
    data = text.encode("utf-8")
    if len(data) < args.min_bytes:
        sys.exit(f"make_corpus: only {len(data)} bytes, want {args.min_bytes}")
    pathlib.Path(args.out).write_bytes(data)
    print(f"make_corpus: {args.out}: {len(data)} bytes, {len(text)} characters",
          file=sys.stderr)


if __name__ == "__main__":
    main()
