#!/usr/bin/env python3
"""The Engram compressed token map (spec/model.md §4 step 1) built by moeserve (utf8proc) must equal
one built here with Python's unicodedata over the whole vocabulary. Needs: pip install tokenizers.
Env: MOESERVE_BIN, MOESERVE_TOKENIZER (as in test_hf_parity.py)."""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]
# Rust's char::is_whitespace (the White_Space property), which HF's Strip normalizer uses.
WHITE_SPACE = "".join(chr(c) for c in [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                       0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def normalize(text: str) -> str:
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if unicodedata.category(c) != "Mn")
    s = "".join(c.lower() for c in s)  # per character, like HF's Lowercase (no final-sigma rule)
    s = re.sub(r"[ \t\r\n]+", " ", s)
    if s == " ":
        return s
    return s.strip(WHITE_SPACE)


def python_map(tok: Tokenizer) -> list:
    keys = {}
    out = []
    for tid in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(tid)
        else:
            key = normalize(text) or text
        out.append(keys.setdefault(key, len(keys)))
    return out


def main() -> int:
    binary = os.environ.get("MOESERVE_BIN", str(REPO / "build" / "bin" / "moeserve"))
    tok_path = pathlib.Path(os.environ.get("MOESERVE_TOKENIZER", str(REPO / "assets" / "tokenizer")))
    tok_file = tok_path / "tokenizer.json" if tok_path.is_dir() else tok_path
    want = python_map(Tokenizer.from_file(str(tok_file)))
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "map.json"
        subprocess.run([binary, "tokenize", "--model", str(tok_file), "--engram-map-out", str(out)], check=True)
        got = json.loads(out.read_text())
    bad = [i for i, (a, b) in enumerate(zip(want, got["map"])) if a != b]
    print(f"vocab {len(want)}, compressed {max(want) + 1} (moeserve {got['num_compressed']}), "
          f"{len(bad)} mismatches{'' if not bad else ' first at id %d' % bad[0]}")
    ok = len(want) == len(got["map"]) and not bad and got["num_compressed"] == max(want) + 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
