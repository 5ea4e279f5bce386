#!/usr/bin/env python3
"""Parity of moeserve's tokenizer with Hugging Face `tokenizers` (pip install tokenizers).

Generates >= 10,000 strings (random Unicode incl. CJK, emoji, combining marks, whitespace runs,
digits, code, special tokens), runs them through one `moeserve tokenize --jsonl-in/--jsonl-out`
process and checks: identical ids (with and without the BOS template), identical decoded text
(with and without skip_special_tokens), streaming decode == full decode, and identical decoding
of random id sequences. Env: MOESERVE_BIN (the moeserve binary), MOESERVE_TOKENIZER (a
tokenizer.json or folder; default assets/tokenizer), PARITY_COUNT (default 12000).
"""
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]

RANGES = [
    (0x20, 0x7E, 30),      # ASCII
    (0xA0, 0x24F, 6),      # Latin-1 + Latin Extended
    (0x370, 0x3FF, 3),     # Greek
    (0x400, 0x4FF, 3),     # Cyrillic
    (0x590, 0x6FF, 2),     # Hebrew, Arabic
    (0x900, 0x97F, 2),     # Devanagari
    (0xE00, 0xE7F, 1),     # Thai
    (0x300, 0x36F, 4),     # combining marks
    (0x1AB0, 0x1AFF, 1),   # combining marks extended
    (0x2000, 0x206F, 3),   # general punctuation and spaces
    (0x2070, 0x22FF, 2),   # super/subscripts, currency, letterlike, arrows, math
    (0x3000, 0x30FF, 4),   # CJK punctuation, hiragana, katakana
    (0x4E00, 0x9FFF, 10),  # CJK ideographs
    (0xAC00, 0xD7A3, 3),   # Hangul
    (0xFF00, 0xFFEF, 2),   # full-width forms
    (0x1F300, 0x1FAFF, 6), # emoji
    (0x1D400, 0x1D7FF, 1), # math alphanumerics
    (0x10000, 0x1007F, 1), # Linear B
]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u0085", "\u2003",
              "\u200b", "\x0b", "\x0c", " \n ", "\n\n", "    "]
DIGITS = "0123456789٠١٢٣٤٥٦٧٨٩०१२३४५६७८९０１２３４５６７８９½²³¼⅓Ⅻ"
CODE = ["def f(x):\n    return x**2\n", "int main() { return 0; }", "{\"a\": [1, 2, {\"b\": null}]}",
        "for (i = 0; i < n; ++i) a[i] += b[i];", "SELECT * FROM t WHERE x >= 10;", "x_y-z.w/v\\u",
        "<div class=\"c\">&amp;</div>", "#!/bin/sh\necho $HOME && ls -la | grep '.py'\n",
        "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }", "a+=1;b-=2;c*=3;d/=4;e%=5;"]
EMOJI_SEQ = ["👨‍👩‍👧‍👦", "👍🏽", "🇫🇷", "❤️", "☺︎", "🏳️‍🌈", "1️⃣", "🧑🏿‍🚀"]


def assigned(cp: int) -> bool:
    return unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co")


def random_char(rng: random.Random) -> str:
    lo, hi, _ = rng.choices(RANGES, weights=[r[2] for r in RANGES])[0]
    while True:
        cp = rng.randint(lo, hi)
        if assigned(cp):
            return chr(cp)


def random_string(rng: random.Random, specials: list, corpus: str) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.35:
            parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 12))))
        elif kind < 0.50:
            parts.append(rng.choice(WHITESPACE) * rng.randint(1, 3))
        elif kind < 0.60:
            parts.append("".join(rng.choice(DIGITS) for _ in range(rng.randint(1, 9))))
        elif kind < 0.70:
            start = rng.randrange(0, len(corpus) - 200)
            parts.append(corpus[start:start + rng.randint(1, 160)])
        elif kind < 0.78:
            parts.append(rng.choice(CODE))
        elif kind < 0.84:
            parts.append(rng.choice(EMOJI_SEQ))
        elif kind < 0.90:
            parts.append(rng.choice(specials))
        elif kind < 0.95:
            base = rng.choice("aeiouAEIOUnczs")
            parts.append(base + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 4))))
        else:
            parts.append(rng.choice(["'s", "'ll", "don't", "I'M", "e-mail", "x.y", "--", "...", "!?"]))
    return "".join(parts)


def main() -> int:
    binary = os.environ.get("MOESERVE_BIN", str(REPO / "build" / "bin" / "moeserve"))
    tok_path = pathlib.Path(os.environ.get("MOESERVE_TOKENIZER", str(REPO / "assets" / "tokenizer")))
    tok_file = tok_path / "tokenizer.json" if tok_path.is_dir() else tok_path
    count = int(os.environ.get("PARITY_COUNT", "12000"))
    hf = Tokenizer.from_file(str(tok_file))
    specials = [t.content for t in hf.get_added_tokens_decoder().values()]
    corpus_path = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
    corpus = corpus_path.read_text(encoding="utf-8") if corpus_path.exists() else \
        (REPO / "tools" / "tokenizer" / "multilingual.txt").read_text(encoding="utf-8")
    rng = random.Random(20240604)

    requests = []
    for i in range(count):
        requests.append({"text": random_string(rng, specials, corpus), "add_special_tokens": i % 5 == 0})
    vocab = hf.get_vocab_size(with_added_tokens=True)
    for _ in range(count // 10):
        requests.append({"ids": [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]})

    with tempfile.TemporaryDirectory() as tmp:
        req_path = pathlib.Path(tmp) / "in.jsonl"
        resp_path = pathlib.Path(tmp) / "out.jsonl"
        req_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests), encoding="utf-8")
        subprocess.run([binary, "tokenize", "--model", str(tok_file), "--jsonl-in", str(req_path),
                        "--jsonl-out", str(resp_path)], check=True)
        responses = [json.loads(line) for line in resp_path.read_text(encoding="utf-8").split("\n") if line]

    assert len(responses) == len(requests), f"{len(responses)} responses for {len(requests)} requests"
    failures = 0
    texts = 0
    for req, resp in zip(requests, responses):
        if "text" in req:
            texts += 1
            ids = hf.encode(req["text"], add_special_tokens=req["add_special_tokens"]).ids
            if resp["ids"] != ids:
                failures += 1
                if failures <= 10:
                    print(f"ENCODE MISMATCH for {req['text']!r}\n  hf:  {ids}\n  ms:  {resp['ids']}")
                continue
            if not resp["stream_ok"]:
                failures += 1
                print(f"STREAM MISMATCH for {req['text']!r}")
        else:
            ids = req["ids"]
        for key, skip in (("text", False), ("text_skip_special", True)):
            want = hf.decode(ids, skip_special_tokens=skip)
            if resp[key] != want:
                failures += 1
                if failures <= 10:
                    print(f"DECODE MISMATCH ({key}) for {ids}\n  hf: {want!r}\n  ms: {resp[key]!r}")
    print(f"{texts} strings, {len(requests) - texts} id sequences, {failures} mismatches")
    assert texts >= 10000
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
