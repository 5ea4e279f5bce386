"""DeepSeek-V4.1 text model oracle (spec model.md §2, §3, §4, §5, §7).  Compute dtype: float64.

Explicit rounding points (all others are exact float64):
  * weights: dequantized from the checkpoint (FP8 32x32 / MXFP4 / BF16) exactly;
  * window KV: fq_fp8 (block 32, ue8m0 pow2 scale) over all hd channels incl. the RoPE tail;
  * compressor: pooled sum rounded to bf16 before compressor.norm (ratio 2 AND ratio 1);
  * main cache: fq_fp4 block 16 with e4m3 scale; index keys/queries: fq_fp4 block 32 ue8m0;
  * activations into every linear stored block-scaled in the checkpoint (FP8 e4m3 32x32 or MXFP4):
    MXFP8 fake-quant, fq_fp8 block 32 along the input dim (Model.lin; act_quant=True).
NOTE [UNCERTAIN] spec §5: V4.1 engines use MXFP8 (block 32) activations, inferred from the 32x32
weight blocks and TRT-LLM projection_quantization="mxfp8" (V4 used block-128 ue8m0 FP8).
BF16/F32 linears (compressor, indexer wk/weights_proj, router gate, head, mHC, ...) see raw x.
"""
from __future__ import annotations

import math

import numpy as np

from . import formats as F
from .config import Config
from .engram import EngramHasher
from .safetensors_np import load_model_dir_with_formats


# ----------------------------------------------------------------------------- helpers
def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def yarn_correction_range(beta_fast, beta_slow, dim, base, orig):
    def corr_dim(n_rot):
        return dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(corr_dim(beta_fast))
    high = math.ceil(corr_dim(beta_slow))
    return max(low, 0), min(high, dim - 1)


def rope_freqs(rd, theta, yarn=None):
    """f_i = theta^(-2i/rd), i < rd/2; YaRN blend per spec §2.2 (no mscale).
    NOTE: YaRN is applied whenever rope_scaling is given (compress rope only); the V4 reference
    gates it on max_seq_len > original_max_position_embeddings, true for both full and tiny."""
    f = 1.0 / (theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
    if yarn:
        factor = float(yarn.get("factor", 1.0))
        orig = yarn.get("original_max_position_embeddings")
        low, high = yarn_correction_range(yarn.get("beta_fast", 32), yarn.get("beta_slow", 1), rd,
                                          theta, orig)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rd // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        smooth = 1.0 - ramp
        f = f / factor * (1.0 - smooth) + f * smooth
    return f


def apply_rope(x, pos, freqs, inverse=False):
    """Rotate the trailing 2*len(freqs) channels of x (interleaved pairs (2i, 2i+1)).
    x: [T, ..., dim]; pos: [T]."""
    x = np.array(x, dtype=np.float64, copy=True)
    rd = 2 * len(freqs)
    dim = x.shape[-1]
    ang = np.asarray(pos, dtype=np.float64)[:, None] * freqs[None, :]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (rd // 2,)
    c = np.cos(ang).reshape(shape)
    s = np.sin(ang).reshape(shape)
    if inverse:
        s = -s
    a = x[..., dim - rd::2].copy()
    b = x[..., dim - rd + 1::2].copy()
    x[..., dim - rd::2] = a * c - b * s
    x[..., dim - rd + 1::2] = a * s + b * c
    return x


def topk_mask(scores, allowed, k):
    """Exact top-k per row over `allowed` entries.  NOTE tie rule (ReLU makes exact zeros
    common): higher score first, then LOWER index (stable sort); -0.0 == +0.0.  Returns a bool mask of the same shape.  k_row = min(k, n_allowed)."""
    T, N = scores.shape
    out = np.zeros((T, N), dtype=bool)
    if N == 0 or k <= 0:
        return out
    s = np.where(allowed, scores, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    rows = np.arange(T)[:, None]
    out[rows, order] = True
    return out & allowed


class Model:
    def __init__(self, cfg: Config, weights: dict, compressed_map=None, moe_norm_top1=True,
                 block_scaled=(), act_quant=True):
        """compressed_map: int array [vocab] of Engram compressed ids (-1 = DEAD); identity if
        None and engram_compressed_vocab_size == vocab_size.
        moe_norm_top1: NOTE [UNCERTAIN] spec §5 normalizes routing weights unconditionally while
        §10 caution 4 says HF normalizes only when top-k > 1; default True = always normalize.
        block_scaled: names (without '.weight') of the linears the checkpoint stores FP8 / MXFP4
        (safetensors_np.block_scaled_linears; from_dir fills it).
        act_quant: MXFP8 activations into those linears (spec §5 [UNCERTAIN]); False for
        comparisons against HF transformers, which runs its linears on unquantized inputs."""
        self.cfg = cfg
        self.w = weights
        self.moe_norm_top1 = moe_norm_top1
        self.block_scaled = frozenset(block_scaled)
        self.act_quant = act_quant
        c = cfg
        self.freqs_main = rope_freqs(c.rd, c.rope_theta, None)
        self.freqs_comp = rope_freqs(c.rd, c.compress_rope_theta, c.rope_scaling)
        if c.engram_layer_ids:
            if compressed_map is None:
                if c.engram_compressed_vocab != c.vocab_size:
                    raise ValueError("Engram needs a compressed token map for this config")
                compressed_map = np.arange(c.vocab_size, dtype=np.int64)
            self.cmap = np.asarray(compressed_map, dtype=np.int64)
            c.engram_pad_compressed = int(self.cmap[c.engram_pad_id])
            self.hasher = EngramHasher(c)
        else:
            self.cmap = None
            self.hasher = None

    @classmethod
    def from_dir(cls, model_dir, **kw):
        cfgd, w, block_scaled = load_model_dir_with_formats(model_dir)
        return cls(Config(cfgd), w, block_scaled=block_scaled, **kw)

    # ------------------------------------------------------------------ small pieces
    def act_in(self, x, name):
        """The input of linear `name` as its GEMM reads it: MXFP8 fake-quant (fq_fp8, block 32
        along the input dim) when the checkpoint stores the weight FP8 / MXFP4 and act_quant is
        on, else x.  NOTE [UNCERTAIN] spec §5 (MXFP8 block 32 inferred, see module docstring)."""
        if self.act_quant and name in self.block_scaled:
            return F.fq_fp8(x, 32)
        return x

    def lin(self, x, name):
        return self.act_in(x, name) @ self.w[name + ".weight"].T

    def norm(self, x, name):
        return rmsnorm(x, self.w[name + ".weight"], self.cfg.eps)

    def mixes(self, X, p):
        """mHC coefficients for site prefix p ('layers.l.hc_attn' ...): pre, post, C [T,HC,HC]."""
        c = self.cfg
        HC = c.HC
        T = X.shape[0]
        f = X.reshape(T, HC * c.D)
        fn, base, scale = self.w[p + "_fn"], self.w[p + "_base"], self.w[p + "_scale"]
        mix = (f @ fn.T) / np.sqrt(np.mean(f * f, axis=-1, keepdims=True) + c.eps)
        pre = sigmoid(mix[:, :HC] * scale[0] + base[:HC]) + c.hc_eps
        post = 2.0 * sigmoid(mix[:, HC:2 * HC] * scale[1] + base[HC:2 * HC])
        C = (mix[:, 2 * HC:] * scale[2] + base[2 * HC:]).reshape(T, HC, HC)
        C = sinkhorn(C, c.sinkhorn_iters, c.hc_eps)
        return pre, post, C

    @staticmethod
    def collapse(X, p):
        return np.einsum("tk,tkd->td", p, X)

    @staticmethod
    def expand(y, X, post, C):
        return post[:, :, None] * y[:, None, :] + np.einsum("tjk,tjd->tkd", C, X)

    # ------------------------------------------------------------------ Engram (§4)
    def engram(self, l, X, ids_rows, image_rows):
        c = self.cfg
        p = f"layers.{l}.engram."
        T = X.shape[0]
        e = self.w[p + "table.weight"][ids_rows].reshape(T, -1)
        kv = self.lin(e, p + "wkv")
        key = kv[:, :c.HC * c.D].reshape(T, c.HC, c.D)
        val = kv[:, c.HC * c.D:]
        wqk = self.w[p + "q_weight"] * self.w[p + "k_weight"]
        dot = np.sum(X * wqk[None] * key, axis=-1)
        dot = dot / np.sqrt(np.mean(X * X, axis=-1) + c.eps) / np.sqrt(np.mean(key * key, axis=-1) + c.eps)
        dot = dot / math.sqrt(c.D)
        g = sigmoid(np.copysign(np.sqrt(np.maximum(np.abs(dot), 1e-6)), dot))
        g = np.where(image_rows[:, None], 0.0, g)
        return X + g[:, :, None] * val[:, None, :]

    # ------------------------------------------------------------------ MoE (§5)
    def expert(self, p, x, weight=None):
        # NOTE: the swiglu clamp is applied to the shared expert too (spec §5 `Expert(x)`).
        lim = self.cfg.swiglu_limit
        g = self.lin(x, p + ".w1")
        u = self.lin(x, p + ".w3")
        if lim > 0:
            u = np.clip(u, -lim, lim)
            g = np.minimum(g, lim)
        h = silu(g) * u
        if weight is not None:
            h = h * weight[:, None]
        return self.lin(h, p + ".w2")

    def moe(self, p, x, image_rows, n_exp, k):
        """p = 'layers.l.ffn' or 'mtp.s.ffn'.  Returns (y, chosen expert ids [T,k])."""
        c = self.cfg
        z = self.lin(x, p + ".gate") / c.gate_temp
        if c.scoring_func == "sqrtsoftplus":
            s = np.sqrt(np.logaddexp(0.0, z))
        elif c.scoring_func == "sigmoid":
            s = sigmoid(z)
        else:
            raise ValueError(c.scoring_func)
        bias = self.w.get(p + ".gate.bias", np.zeros(n_exp))
        bias_vl = self.w.get(p + ".gate.bias_vl", bias)
        sel = s + np.where(image_rows[:, None], bias_vl[None], bias[None])
        # NOTE tie rule for expert choice: higher biased score first, then lower expert index.
        idx = np.argsort(-sel, axis=1, kind="stable")[:, :k]
        wts = np.take_along_axis(s, idx, axis=1)
        if c.norm_topk_prob and (k > 1 or self.moe_norm_top1):
            wts = wts / (wts.sum(axis=1, keepdims=True) + 1e-20)
        wts = wts * c.routed_scale
        y = np.zeros_like(x)
        for e in range(n_exp):
            rows, slot = np.nonzero(idx == e)
            if len(rows):
                y[rows] += self.expert(f"{p}.experts.{e}", x[rows], wts[rows, slot])
        y += self.expert(p + ".shared_experts", x)
        return y, idx

    # ------------------------------------------------------------------ attention core (§2.5)
    def attend(self, prefix, q, K, mask, pos, freqs):
        """q [T,H,hd], K [N,hd] (K=V), mask [T,N] -> output projection y [T,D]."""
        c = self.cfg
        logits = np.einsum("thd,nd->thn", q, K) * c.hd ** -0.5
        logits = np.where(mask[:, None, :], logits, -np.inf)
        sink = self.w[prefix + "attn_sink"][None, :, None]
        m = np.maximum(np.max(logits, axis=-1, keepdims=True), sink)
        e = np.exp(logits - m)
        denom = e.sum(-1, keepdims=True) + np.exp(sink - m)
        o = np.einsum("thn,nd->thd", e / denom, K)
        o = apply_rope(o, pos, freqs, inverse=True)
        T = q.shape[0]
        og = self.act_in(o.reshape(T, c.G, c.H * c.hd // c.G), prefix + "wo_a")
        wo_a = self.w[prefix + "wo_a.weight"].reshape(c.G, c.O, c.H * c.hd // c.G)
        yg = np.einsum("tgi,goi->tgo", og, wo_a).reshape(T, c.G * c.O)
        return self.lin(yg, prefix + "wo_b")

    def q_and_kv(self, prefix, a, pos, freqs):
        c = self.cfg
        qr = self.norm(self.lin(a, prefix + "wq_a"), prefix + "q_norm")
        q = self.lin(qr, prefix + "wq_b").reshape(len(a), c.H, c.hd)
        q = apply_rope(q, pos, freqs)
        kv = self.norm(self.lin(a, prefix + "wkv"), prefix + "kv_norm")
        kv = F.fq_fp8(apply_rope(kv, pos, freqs), 32)
        return qr, q, kv

    # ------------------------------------------------------------------ compressor (§2.3)
    def compressor(self, l, a, pos):
        """a: attention input for positions 0..T-1 (all rows).  Only complete groups are emitted."""
        c = self.cfg
        p = f"layers.{l}.attn."
        r = c.ratios[l]
        assert np.array_equal(pos, np.arange(len(pos))), "compressor needs all rows from position 0"
        kvc = self.lin(a, p + "compressor.wkv")
        if r == 1:
            pooled = kvc
        else:
            n = len(a) // r
            g = self.lin(a, p + "compressor.wgate")[: n * r].reshape(n, r, c.hd)
            pooled = np.sum(softmax(g, axis=1) * kvc[: n * r].reshape(n, r, c.hd), axis=1)
        # NOTE: bf16 cast before compressor.norm also applied to ratio 1 (activation dtype).
        latent = self.norm(F.bf16_round(pooled), p + "compressor.norm")
        gpos = r * np.arange(len(latent))
        main = F.fq_fp4_e4m3(apply_rope(latent, gpos, self.freqs_comp), 16)
        ik = self.norm(self.lin(latent, p + "indexer.wk"), p + "indexer.k_norm")
        idxk = F.fq_fp4_ue8m0(apply_rope(ik, gpos, self.freqs_comp), 32)
        return {"latent": latent, "main": main, "idxk": idxk, "ratio": r}

    # ------------------------------------------------------------------ indexer (§2.4)
    def indexer(self, l, st, qr, a, pos):
        c = self.cfg
        p = f"layers.{l}.attn.indexer."
        owner = c.kv_owner(l)
        cache = st["caches"][owner]
        idxk, r = cache["idxk"], cache["ratio"]
        N = len(idxk)
        T = len(a)
        qi = self.lin(qr, p + "wq_b").reshape(T, c.IH, c.ID)
        qi = F.fq_fp4_ue8m0(apply_rope(qi, pos, self.freqs_comp), 32)
        w = self.lin(a, p + "weights_proj") * c.IH ** -0.5
        dots = np.maximum(np.einsum("thd,nd->thn", qi, idxk), 0.0)
        S = np.einsum("th,thn->tn", w, dots) * c.ID ** -0.5
        nvis = (pos + 1) // r
        visible = np.arange(N)[None, :] < nvis[:, None]
        info = {"n_visible_max": int(nvis.max()) if T else 0, "N": N}
        allowed = visible
        if l == c.cand:
            bs = c.cand_bs
            nb = -(-N // bs)
            Sv = np.full((T, nb * bs), -np.inf)
            Sv[:, :N] = np.where(visible, S, -np.inf)
            B = Sv.reshape(T, nb, bs).max(axis=2)
            newest = (nvis - 1) // bs
            has = nvis > 0
            B[np.nonzero(has)[0], newest[has]] = np.inf
            bsel = topk_mask(B, B > -np.inf, c.cand_topk_blocks)
            cand_mask = np.repeat(bsel, bs, axis=1)[:, :N]
            st["cand_mask"] = cand_mask
            info["cand_pool_last"] = int((cand_mask[-1] & visible[-1]).sum()) if T else 0
        elif c.cand is not None and l > c.cand:
            allowed = visible & st["cand_mask"]
            info["allowed_last"] = int(allowed[-1].sum()) if T else 0
        sel = topk_mask(S, allowed, c.topk)
        info["selected_last"] = int(sel[-1].sum()) if T else 0
        info["n_visible_last"] = int(nvis[-1]) if T else 0
        st["sel"][l] = sel
        st["scores"][l] = S
        return info

    # ------------------------------------------------------------------ one decoder block
    def layer(self, l, X, pre_prev, pos, st):
        c = self.cfg
        p = f"layers.{l}."
        if l == c.cand:
            st["encoder_out"] = X.copy()  # residual streams leaving layer cand-1 (all rows)
        if l in c.engram_layer_ids:
            X = self.engram(l, X, st["hash"][l][pos], st["image"][pos])
        if l in c.dspark_targets:
            st["taps"][l] = (pos.copy(), X.mean(axis=1))
        a = self.norm(self.collapse(X, pre_prev), p + "attn_norm")
        if l in c.kv_src:
            st["caches"][l] = self.compressor(l, a, pos)
        if st["production"] and l == c.cand:
            R = pos >= st["floor"]
            X, a, pos, pre_prev = X[R], a[R], pos[R], pre_prev[R]
        pre_a, post_a, C_a = self.mixes(X, p + "hc_attn")
        ratio = c.ratios[l]
        freqs = self.freqs_comp if ratio > 0 else self.freqs_main
        qr, q, kv = self.q_and_kv(p + "attn.", a, pos, freqs)
        dpos = pos[:, None] - pos[None, :]
        Ks, Ms = [kv], [(dpos >= 0) & (dpos < c.W)]
        info = {"mode": c.mode(l), "rows": len(pos)}
        if ratio > 0:
            if l in c.idx_src:
                info.update(self.indexer(l, st, qr, a, pos))
            owner, io = c.kv_owner(l), c.idx_owner(l)
            Ks.append(st["caches"][owner]["main"])
            Ms.append(st["sel"][io])
            info["kv_owner"], info["idx_owner"] = owner, io
        y = self.attend(p + "attn.", q, np.concatenate(Ks), np.concatenate(Ms, axis=1), pos, freqs)
        X = self.expand(y, X, post_a, C_a)
        pre_f, post_f, C_f = self.mixes(X, p + "hc_ffn")
        f = self.norm(self.collapse(X, pre_a), p + "ffn_norm")
        y, idx = self.moe(p + "ffn", f, st["image"][pos], c.E, c.K)
        X = self.expand(y, X, post_f, C_f)
        st["info"][l] = info
        st["experts"][l] = idx
        st["attn_in"][l] = (pos.copy(), a)
        st["layer_out"][l] = (pos.copy(), X)
        return X, pre_f, pos

    # ------------------------------------------------------------------ whole model
    def forward(self, ids, mode="oracle", image_mask=None):
        """ids: int [T] (positions 0..T-1).  mode: 'oracle' (all layers, all rows) or
        'production' (bounded replay, spec §2.6/§7.2: layers >= candidate_source_layer_id run
        only on rows [max(0,T-W), T) except the boundary layer's compressor/index keys).
        Returns a state dict with 'logits' [rows, V] for the final row set and 'rows' (positions)."""
        c = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        image = np.zeros(T, dtype=bool) if image_mask is None else np.asarray(image_mask, dtype=bool)
        if c.image_token_id is not None:
            image = image | (ids == c.image_token_id)
        st = {"production": mode == "production", "floor": max(0, T - c.W) if mode == "production" else 0,
              "image": image, "caches": {}, "sel": {}, "scores": {}, "taps": {}, "info": {},
              "experts": {}, "hash": {}, "attn_in": {}, "layer_out": {}}
        if mode not in ("oracle", "production"):
            raise ValueError(mode)
        if self.hasher is not None:
            cids = np.where(image, -1, self.cmap[ids])
            for l in c.engram_layer_ids:
                st["hash"][l] = self.hasher.hash_ids(cids, l)
        X = np.repeat(self.w["embed.weight"][ids][:, None, :], c.HC, axis=1)
        pre = np.zeros((T, c.HC))
        pre[:, 0] = 1.0
        pos = np.arange(T)
        for l in range(c.L):
            X, pre, pos = self.layer(l, X, pre, pos, st)
        h = self.norm(self.collapse(X, pre), "norm")
        st["logits"] = self.lin(h, "head")
        st["rows"] = pos
        if c.dspark_targets and all(t in st["taps"] for t in c.dspark_targets):
            tp = st["taps"][c.dspark_targets[0]][0]
            st["main_hidden_pos"] = tp
            st["main_hidden"] = np.concatenate([st["taps"][t][1] for t in c.dspark_targets], axis=1)
        return st

    def logits_all_positions(self, ids, image_mask=None):
        return self.forward(ids, "oracle", image_mask)["logits"]

    def prefill_production(self, ids, image_mask=None):
        return self.forward(ids, "production", image_mask)["logits"][-1]


def sinkhorn(C, iters, eps):
    """C[..., j, k]: softmax over k, +eps, column-normalize, then (iters-1) x (row, column)."""
    C = softmax(C, axis=-1) + eps
    C = C / (C.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        C = C / (C.sum(axis=-1, keepdims=True) + eps)
        C = C / (C.sum(axis=-2, keepdims=True) + eps)
    return C
