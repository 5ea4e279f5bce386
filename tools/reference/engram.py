"""Engram hashing (spec model.md §4): primes, offsets, multipliers, n-gram hash ids."""
from __future__ import annotations

import numpy as np

INT64_MAX = np.iinfo(np.int64).max

# Full-size (engram_compressed_vocab_size = 99092) multipliers quoted in spec §4 step 3.
FULL_SIZE_COMPRESSED_VOCAB = 99092
FULL_SIZE_MULTIPLIERS = {
    1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    14: [67716810739261, 51510806800915, 30921347202721, 82619226485591],
}


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in small:  # deterministic for n < 3.3e24
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def engram_primes(layer_ids, max_ngram, n_heads, vocab_size):
    """{layer: [[prime]*n_heads for each order 2..max_ngram]}; the search restarts at
    vocab_size-1 for every (layer, order) and takes the next primes strictly greater than the
    running start that are not in the global `seen` set."""
    seen = set()
    out = {}
    for layer in layer_ids:
        per_order = []
        for _n in range(2, max_ngram + 1):
            start = vocab_size - 1
            heads = []
            for _k in range(n_heads):
                c = start + 1
                while not (c not in seen and is_prime(c)):
                    c += 1
                seen.add(c)
                heads.append(c)
                start = c
            per_order.append(heads)
        out[layer] = per_order
    return out


def engram_multipliers(layer_id: int, compressed_vocab: int, max_ngram: int):
    rng = np.random.default_rng(10007 * layer_id)
    m = rng.integers(0, (INT64_MAX // compressed_vocab) // 2, size=max_ngram, dtype=np.int64) * 2 + 1
    if compressed_vocab == FULL_SIZE_COMPRESSED_VOCAB and layer_id in FULL_SIZE_MULTIPLIERS \
            and max_ngram == 4:
        assert [int(v) for v in m] == FULL_SIZE_MULTIPLIERS[layer_id], "default_rng drifted"
    return m


class EngramHasher:
    def __init__(self, cfg):
        self.cfg = cfg
        self.primes = engram_primes(cfg.engram_layer_ids, cfg.engram_max_ngram, cfg.engram_n_heads,
                                    cfg.engram_vocab_size)
        self.mult = {l: engram_multipliers(l, cfg.engram_compressed_vocab, cfg.engram_max_ngram)
                     for l in cfg.engram_layer_ids}
        self.offsets = {}
        for i, l in enumerate(cfg.engram_layer_ids):
            sizes = [p for order in self.primes[l] for p in order]
            if cfg.engram_num_embeddings and sum(sizes) != cfg.engram_num_embeddings[i]:
                raise ValueError(f"engram layer {l}: prime sum {sum(sizes)} != "
                                 f"engram_num_embeddings {cfg.engram_num_embeddings[i]}")
            self.offsets[l] = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    def shifted_tokens(self, cids):
        """cids: int64 [T] compressed ids, -1 = DEAD.  -> tok [T, max_ngram] (shift s = column s).

        Sticky blocking: once pos < s or a DEAD token is met at shift <= s, shift s and all larger
        shifts use pad' = map[engram_pad_id]."""
        cfg = self.cfg
        cids = np.asarray(cids, dtype=np.int64)
        T = len(cids)
        pad = np.int64(cfg.engram_pad_compressed)
        pos = np.arange(T)
        tok = np.empty((T, cfg.engram_max_ngram), dtype=np.int64)
        blocked = np.zeros(T, dtype=bool)
        for s in range(cfg.engram_max_ngram):
            src = pos - s
            val = np.where(src >= 0, cids[np.maximum(src, 0)], -1)
            blocked |= (src < 0) | (val < 0)
            tok[:, s] = np.where(blocked, pad, val)
        return tok

    def hash_ids(self, cids, layer):
        """-> int64 [T, (max_ngram-1)*n_heads] row ids into the layer's table."""
        cfg = self.cfg
        tok = self.shifted_tokens(cids)
        m = self.mult[layer]
        nh = cfg.engram_n_heads
        out = np.empty((len(tok), (cfg.engram_max_ngram - 1) * nh), dtype=np.int64)
        h = tok[:, 0] * m[0]
        for n in range(1, cfg.engram_max_ngram):
            h = h ^ (tok[:, n] * m[n])
            for k in range(nh):
                c = (n - 1) * nh + k
                out[:, c] = h % np.int64(self.primes[layer][n - 1][k]) + self.offsets[layer][c]
        return out
