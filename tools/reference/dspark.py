"""DSpark draft forward (spec model.md §6.1, §6.2).  Compute dtype: float64.

One cycle: anchor at position P+1 (P = last committed position), block ids
[anchor, noise x (B-1)] at positions P+1 .. P+B; three window-only MoE stages whose attention
reads the per-stage context ring (kv_ctx of the last <= sliding_window committed positions)
plus all B block positions (bidirectional); Markov head; confidence head; greedy drafts.
"""
from __future__ import annotations

import numpy as np

from . import formats as F
from .model import Model, apply_rope, sigmoid


def main_x(model: Model, main_hidden):
    """main_hidden [n, 3D] (mean-over-streams taps) -> main_norm(main_proj(.)) [n, D]."""
    return model.norm(model.lin(main_hidden, "mtp.0.main_proj"), "mtp.0.main_norm")


def context_kv(model: Model, stage: int, mx, ctx_pos):
    """kv_ctx(p) = fq_fp8(rope(kv_norm(wkv_stage(main_x[p])), p)), main rope (ratio 0).
    NOTE [UNCERTAIN, spec §6.1 chosen behaviour]: V4.1 rule, block 32 over all hd incl. rope."""
    p = f"mtp.{stage}.attn."
    kv = model.norm(model.lin(mx, p + "wkv"), p + "kv_norm")
    return F.fq_fp8(apply_rope(kv, ctx_pos, model.freqs_main), 32)


def draft(model: Model, main_hidden, ctx_pos, anchor: int, greedy=True):
    """main_hidden: [n, 3D] taps for the committed positions ctx_pos (ascending, contiguous,
    ending at P); only the last `sliding_window` of them are used (the ring).
    Returns dict: U [B,V] base logits, l [B,V] Markov-adjusted logits, d [B] drafts, c [B]
    confidences, hb [B,D]."""
    c = model.cfg
    w = model.w
    B = c.dspark_block
    ctx_pos = np.asarray(ctx_pos, dtype=np.int64)
    main_hidden = np.asarray(main_hidden, dtype=np.float64)
    keep = ctx_pos > ctx_pos[-1] - c.W if len(ctx_pos) else np.zeros(0, bool)
    ctx_pos, main_hidden = ctx_pos[keep], main_hidden[keep]
    P = int(ctx_pos[-1]) if len(ctx_pos) else -1
    pos = P + 1 + np.arange(B)
    ids = np.array([anchor] + [c.dspark_noise] * (B - 1), dtype=np.int64)
    mx = main_x(model, main_hidden) if len(ctx_pos) else np.zeros((0, c.D))
    X = np.repeat(w["embed.weight"][ids][:, None, :], c.HC, axis=1)
    pre = np.zeros((B, c.HC))
    pre[:, 0] = 1.0
    no_image = np.zeros(B, dtype=bool)
    experts = []
    for s in range(c.nextn):
        p = f"mtp.{s}."
        pre_a, post_a, C_a = model.mixes(X, p + "hc_attn")
        a = model.norm(model.collapse(X, pre), p + "attn_norm")
        _, q, kv_blk = model.q_and_kv(p + "attn.", a, pos, model.freqs_main)
        kv_ctx = context_kv(model, s, mx, ctx_pos) if len(ctx_pos) else np.zeros((0, c.hd))
        K = np.concatenate([kv_ctx, kv_blk])
        # NOTE: every block query sees the whole ring (last <= W committed positions) and all B
        # block positions (bidirectional, no causal mask).
        mask = np.ones((B, len(K)), dtype=bool)
        y = model.attend(p + "attn.", q, K, mask, pos, model.freqs_main)
        X = model.expand(y, X, post_a, C_a)
        pre_f, post_f, C_f = model.mixes(X, p + "hc_ffn")
        f = model.norm(model.collapse(X, pre_a), p + "ffn_norm")
        y, idx = model.moe(p + "ffn", f, no_image, c.dspark_E, c.dspark_K)
        experts.append(idx)
        X = model.expand(y, X, post_f, C_f)
        pre = pre_f
    last = f"mtp.{c.nextn - 1}."
    hb = model.collapse(X, pre)
    U = model.lin(model.norm(hb, last + "norm"), "head")
    memb = w[last + "markov_head.embed.weight"]
    mhead = w[last + "markov_head.head.weight"]
    conf = w[last + "confidence_head.proj.weight"][0]
    prev = int(anchor)
    ls, ds, cs = [], [], []
    for i in range(B):
        m_i = memb[prev]
        l_i = U[i] + mhead @ m_i
        # NOTE greedy tie rule: np.argmax -> lowest token id among equal maxima.
        d_i = int(np.argmax(l_i))
        # NOTE: confidence uses the un-normalized collapsed hidden hb[i] (spec §6.2 literal).
        c_i = float(sigmoid(conf @ np.concatenate([hb[i], m_i])))
        ls.append(l_i)
        ds.append(d_i)
        cs.append(c_i)
        prev = d_i
    return {"U": U, "l": np.stack(ls), "d": np.array(ds, dtype=np.int64), "c": np.array(cs),
            "hb": hb, "positions": pos, "ctx_pos": ctx_pos, "experts": np.stack(experts)}
