#!/usr/bin/env python3
"""Train moeserve's tiny byte-level BPE tokenizer (assets/tokenizer/).

The tokenizer mirrors DeepSeek-V3/V4's tokenizer.json layout on a small scale: the same three-stage
Split pre-tokenizer (digits in groups of up to three, CJK runs, then the word/punctuation/space
pattern), a ByteLevel stage without regex, a ByteLevel decoder, special tokens at the lowest ids and
a template post-processor that prepends BOS. The vocabulary size includes the special tokens, so a
model config's vocab_size must equal VOCAB_SIZE.

Usage: python3 tools/tokenizer/train_tokenizer.py [--out assets/tokenizer]
Needs: pip install tokenizers. Output is deterministic for a given tokenizers version.
"""
import argparse
import hashlib
import json
import os
import pathlib

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 4096
REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = [
    REPO.parent / "shared" / "data" / "tinyshakespeare.txt",
    pathlib.Path(__file__).resolve().parent / "multilingual.txt",
]

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
# (content, special). Special tokens are dropped by skip_special_tokens; the thinking tags and the
# DSML marker are added tokens that stay in decoded text because the output parser needs them.
ADDED_TOKENS = [
    (BOS, True),
    (EOS, True),
    (PAD, True),
    ("<｜User｜>", True),
    ("<｜Assistant｜>", True),
    ("<think>", False),
    ("</think>", False),
    ("｜DSML｜", False),
    ("<｜latest_reminder｜>", True),
    ("<｜action｜>", True),
    ("<｜query｜>", True),
    ("<｜authority｜>", True),
    ("<｜domain｜>", True),
    ("<｜title｜>", True),
    ("<｜read_url｜>", True),
    ("<｜fim▁hole｜>", True),
    ("<｜fim▁begin｜>", True),
    ("<｜fim▁end｜>", True),
]

# DeepSeek-V3/V4's pre-tokenizer Split patterns (all with behavior Isolated).
SPLIT_DIGITS = r"\p{N}{1,3}"
SPLIT_CJK = "[一-龥\u3040-ゟ゠-ヿ]+"
SPLIT_MAIN = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
    r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_DIGITS), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_CJK), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_MAIN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "assets" / "tokenizer"))
    ap.add_argument("--corpus", nargs="*", default=[str(p) for p in DEFAULT_CORPUS])
    args = ap.parse_args()

    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[content for content, _ in ADDED_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Sorted, line-by-line input: the trainer's pair counts (and so its merges) do not depend on
    # thread scheduling.
    lines = []
    for path in args.corpus:
        lines.extend(pathlib.Path(path).read_text(encoding="utf-8").splitlines(keepends=True))
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))

    data = json.loads(tok.to_str())
    special = dict(ADDED_TOKENS)
    for entry in data["added_tokens"]:
        entry["special"] = special[entry["content"]]
    size = len(data["model"]["vocab"])
    assert size == VOCAB_SIZE, f"trained vocab has {size} entries, wanted {VOCAB_SIZE}"

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, ensure_ascii=False, indent=2) + "\n"
    (out / "tokenizer.json").write_text(text, encoding="utf-8")
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "vocab_size": VOCAB_SIZE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n",
                                               encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    print(f"wrote {out}/tokenizer.json: vocab {size} (incl. {len(ADDED_TOKENS)} added tokens), sha256 {digest}")


if __name__ == "__main__":
    main()
