"""Engram hash multipliers (model.md §4 step 3), computed once with numpy's PCG64 so the C++ side
never reimplements it. Prints a JSON list per engram layer for config.json `engram_multipliers`.

    python3 tools/gen_engram_multipliers.py --layers 1 4 --compressed-vocab 256 [--max-ngram 4]
"""
import argparse
import json

import numpy as np


def multipliers(layer_id, compressed_vocab, max_ngram):
    rng = np.random.default_rng(10007 * layer_id)
    bound = (np.iinfo(np.int64).max // compressed_vocab) // 2
    return [int(v) for v in rng.integers(0, bound, size=max_ngram, dtype=np.int64) * 2 + 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="+", required=True)
    ap.add_argument("--compressed-vocab", type=int, required=True)
    ap.add_argument("--max-ngram", type=int, default=4)
    a = ap.parse_args()
    print(json.dumps([multipliers(l, a.compressed_vocab, a.max_ngram) for l in a.layers]))


if __name__ == "__main__":
    main()
