"""Deterministic generator of the spec §9 tiny checkpoint (config.json + model.safetensors)
in the exact docs/checkpoint_format.md layout.

    python -m tools.reference.make_tiny OUT_DIR [--seed 0]
"""
from __future__ import annotations

import argparse
import copy
import json
import os

import numpy as np

from . import formats as F
from .config import Config
from .safetensors_np import Tensor, write_file

TINY_CONFIG = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "text_config": {
        "model_type": "deepseek_v41_text",
        "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 12,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16,
        "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
        "sliding_window": 8,
        "compress_ratios": [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0],
        "kv_source_layer_ids": [2, 4, 6],
        "index_source_layer_ids": [2, 4, 6, 8, 10],
        "candidate_source_layer_id": 6, "candidate_topk_blocks": 4, "candidate_block_size": 4,
        "index_n_heads": 2, "index_head_dim": 32, "index_topk": 8,
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 32,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 512,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "gate_temp": 1.0, "swiglu_limit": 10.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-20,
        "engram_layer_ids": [1, 4], "engram_vocab_size": 101, "engram_num_embeddings": [660, 864],
        "engram_max_ngram_size": 4, "engram_n_heads": 2, "engram_head_dim": 32,
        "engram_pad_id": 2, "engram_compressed_vocab_size": 256,
        "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 255,
        "dspark_target_layer_ids": [9, 10, 11], "dspark_markov_rank": 8,
        "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 1,
        "hidden_act": "silu", "tie_word_embeddings": False, "eos_token_id": 1,
    },
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32], "scale_fmt": "ue8m0"},
}


class _Gen:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.t = {}

    def normal(self, shape, std, mean=0.0):
        return mean + std * self.rng.standard_normal(shape)

    def bf16(self, name, arr):
        self.t[name] = Tensor("BF16", F.bf16_round(arr).astype(np.float32).astype(F.BF16))

    def f32(self, name, arr):
        self.t[name] = Tensor("F32", np.asarray(arr, dtype=np.float32))

    def fp8(self, name, arr):  # name without ".weight"
        q, s = F.quant_fp8_block(arr)
        self.t[name + ".weight"] = Tensor("F8_E4M3", q.view(F.E4M3))
        self.t[name + ".scale"] = Tensor("F8_E8M0", s)

    def mxfp4(self, name, arr):
        q, s = F.quant_mxfp4(arr)
        self.t[name + ".weight"] = Tensor("I8", q)
        self.t[name + ".scale"] = Tensor("F8_E8M0", s)


def _block(g: _Gen, c: Config, p: str, ratio: int, l: int | None, n_exp: int, draft: bool):
    D, HC, H, hd, Q, G, O, I = c.D, c.HC, c.H, c.hd, c.Q, c.G, c.O, c.I
    M = (2 + HC) * HC
    for site in ("hc_attn", "hc_ffn"):
        g.f32(f"{p}{site}_fn", g.normal((M, HC * D), 0.05))
        base = np.zeros(M)
        base[:HC] = g.normal(HC, 0.3)
        base[HC:2 * HC] = g.normal(HC, 0.3)
        base[2 * HC:] = (2.0 * np.eye(HC) + g.normal((HC, HC), 0.3)).reshape(-1)
        g.f32(f"{p}{site}_base", base)
        g.f32(f"{p}{site}_scale", g.normal(3, 0.2, 1.0))
    g.bf16(p + "attn_norm.weight", g.normal(D, 0.1, 1.0))
    g.bf16(p + "ffn_norm.weight", g.normal(D, 0.1, 1.0))
    a = p + "attn."
    g.fp8(a + "wq_a", g.normal((Q, D), D ** -0.5))
    g.bf16(a + "q_norm.weight", g.normal(Q, 0.1, 1.0))
    g.fp8(a + "wq_b", g.normal((H * hd, Q), Q ** -0.5))
    g.fp8(a + "wkv", g.normal((hd, D), D ** -0.5))
    g.bf16(a + "kv_norm.weight", g.normal(hd, 0.1, 1.0))
    g.fp8(a + "wo_a", g.normal((G * O, H * hd // G), (H * hd // G) ** -0.5))
    g.fp8(a + "wo_b", g.normal((D, G * O), (G * O) ** -0.5))
    g.f32(a + "attn_sink", g.normal(H, 0.5))
    if l is not None and l in c.kv_src:
        g.bf16(a + "compressor.wkv.weight", g.normal((hd, D), D ** -0.5))
        if ratio == 2:
            g.bf16(a + "compressor.wgate.weight", g.normal((hd, D), D ** -0.5))
        g.bf16(a + "compressor.norm.weight", g.normal(hd, 0.1, 1.0))
        g.bf16(a + "indexer.wk.weight", g.normal((c.ID, hd), hd ** -0.5))
        g.bf16(a + "indexer.k_norm.weight", g.normal(c.ID, 0.1, 1.0))
    if l is not None and l in c.idx_src:
        g.fp8(a + "indexer.wq_b", g.normal((c.IH * c.ID, Q), Q ** -0.5))
        g.bf16(a + "indexer.weights_proj.weight", g.normal((c.IH, D), D ** -0.5))
    f = p + "ffn."
    g.bf16(f + "gate.weight", g.normal((n_exp, D), D ** -0.5))
    g.f32(f + "gate.bias", g.normal(n_exp, 0.1))
    if not draft:
        g.f32(f + "gate.bias_vl", g.normal(n_exp, 0.3))
    for e in range(n_exp):
        g.mxfp4(f"{f}experts.{e}.w1", g.normal((I, D), D ** -0.5))
        g.mxfp4(f"{f}experts.{e}.w3", g.normal((I, D), D ** -0.5))
        g.mxfp4(f"{f}experts.{e}.w2", g.normal((D, I), I ** -0.5))
    g.fp8(f + "shared_experts.w1", g.normal((I, D), D ** -0.5))
    g.fp8(f + "shared_experts.w3", g.normal((I, D), D ** -0.5))
    g.fp8(f + "shared_experts.w2", g.normal((D, I), I ** -0.5))


def generate(out_dir: str, seed: int = 0, config: dict | None = None) -> str:
    cfgd = copy.deepcopy(config or TINY_CONFIG)
    c = Config(cfgd)
    g = _Gen(seed)
    D, V = c.D, c.vocab_size
    g.bf16("embed.weight", g.normal((V, D), 1.0))
    g.bf16("head.weight", g.normal((V, D), D ** -0.5))
    g.bf16("norm.weight", g.normal(D, 0.1, 1.0))
    for l in range(c.L):
        _block(g, c, f"layers.{l}.", c.ratios[l], l, c.E, draft=False)
        if l in c.engram_layer_ids:
            i = c.engram_layer_ids.index(l)
            p = f"layers.{l}.engram."
            rows = c.engram_num_embeddings[i]
            q, s = F.quant_row_blocks_fp8(g.normal((rows, c.engram_head_dim), 1.0))
            g.t[p + "table.weight"] = Tensor("F8_E4M3", q.view(F.E4M3))
            g.t[p + "table.scale"] = Tensor("F8_E8M0", s)
            NE = (c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim
            g.fp8(p + "wkv", g.normal((D * (c.HC + 1), NE), NE ** -0.5))
            g.bf16(p + "q_weight", g.normal((c.HC, D), 0.3, 1.0))
            g.bf16(p + "k_weight", g.normal((c.HC, D), 0.3, 1.0))
    for s in range(c.nextn):
        p = f"mtp.{s}."
        _block(g, c, p, 0, None, c.dspark_E, draft=True)
        if s == 0:
            g.fp8(p + "main_proj", g.normal((D, 3 * D), (3 * D) ** -0.5))
            g.bf16(p + "main_norm.weight", g.normal(D, 0.1, 1.0))
        if s == c.nextn - 1:
            R = c.markov_rank
            g.bf16(p + "norm.weight", g.normal(D, 0.1, 1.0))
            g.bf16(p + "markov_head.embed.weight", g.normal((V, R), 1.0))
            g.bf16(p + "markov_head.head.weight", g.normal((V, R), R ** -0.5))
            g.bf16(p + "confidence_head.proj.weight", g.normal((1, D + R), 0.02))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfgd, f, indent=2)
    write_file(os.path.join(out_dir, "model.safetensors"), g.t, {"format": "pt", "generator": "tools.reference.make_tiny"})
    return out_dir


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    generate(a.out_dir, a.seed)
    print(a.out_dir)


if __name__ == "__main__":
    main()
