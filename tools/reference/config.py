"""Model configuration (HF composite layout: text fields under `text_config`)."""
from __future__ import annotations


class Config:
    def __init__(self, d: dict):
        self.raw = d
        tc = d.get("text_config", d)
        g = tc.get
        self.vocab_size = tc["vocab_size"]
        self.D = tc["hidden_size"]
        self.L = tc["num_hidden_layers"]
        self.H = tc["num_attention_heads"]
        self.hd = tc["head_dim"]
        self.rd = tc["qk_rope_head_dim"]
        self.Q = tc["q_lora_rank"]
        self.G = tc["o_groups"]
        self.O = tc["o_lora_rank"]
        self.W = tc["sliding_window"]
        self.nextn = g("num_nextn_predict_layers", 0)
        self.ratios = list(tc["compress_ratios"])
        assert len(self.ratios) >= self.L, "compress_ratios too short"
        self.ratios += [0] * max(0, self.L + self.nextn - len(self.ratios))
        self.kv_src = list(g("kv_source_layer_ids", []))
        self.idx_src = list(g("index_source_layer_ids", []))
        self.cand = g("candidate_source_layer_id", None)
        if self.cand is None and self.kv_src:
            self.cand = self.kv_src[-1]
        self.cand_topk_blocks = g("candidate_topk_blocks", 0)
        self.cand_bs = g("candidate_block_size", 1)
        self.IH = g("index_n_heads", 0)
        self.ID = g("index_head_dim", 0)
        self.topk = g("index_topk", 0)
        self.rope_theta = float(g("rope_theta", 10000.0))
        self.compress_rope_theta = float(g("compress_rope_theta", self.rope_theta))
        self.rope_scaling = g("rope_scaling", None)
        self.E = tc["n_routed_experts"]
        self.n_shared = g("n_shared_experts", 1)
        self.K = tc["num_experts_per_tok"]
        self.I = tc["moe_intermediate_size"]
        self.scoring_func = g("scoring_func", "sqrtsoftplus")
        self.norm_topk_prob = g("norm_topk_prob", True)
        self.routed_scale = float(g("routed_scaling_factor", 1.0))
        self.gate_temp = float(g("gate_temp", 1.0))
        self.swiglu_limit = float(g("swiglu_limit", 0.0) or 0.0)
        self.HC = g("hc_mult", 4)
        self.sinkhorn_iters = g("hc_sinkhorn_iters", 20)
        self.hc_eps = float(g("hc_eps", 1e-6))
        self.eps = float(g("rms_norm_eps", 1e-6))
        self.engram_layer_ids = list(g("engram_layer_ids", []) or [])
        self.engram_num_embeddings = list(g("engram_num_embeddings", []) or [])
        self.engram_max_ngram = g("engram_max_ngram_size", 4)
        self.engram_n_heads = g("engram_n_heads", 8)
        self.engram_head_dim = g("engram_head_dim", 256)
        self.engram_vocab_size = g("engram_vocab_size", 0)
        self.engram_pad_id = g("engram_pad_id", 2)
        self.engram_compressed_vocab = g("engram_compressed_vocab_size", self.vocab_size)
        self.engram_pad_compressed = self.engram_pad_id  # overwritten by the model from the map
        self.dspark_block = g("dspark_block_size", 5)
        self.dspark_noise = g("dspark_noise_token_id", self.vocab_size - 1)
        tl = g("dspark_target_layer_ids", None)
        if tl is None:
            non_kv = [l for l in range(self.L) if l not in self.kv_src]
            tl = non_kv[-3:]
        self.dspark_targets = list(tl)
        self.markov_rank = g("dspark_markov_rank", 0)
        self.dspark_E = g("dspark_n_routed_experts", self.E)
        self.dspark_K = g("dspark_num_experts_per_tok", self.K)
        self.image_token_id = d.get("image_token_id", tc.get("image_token_id"))

    # --- CSA2 roles (spec §2.1)
    def kv_owner(self, l):
        c = [k for k in self.kv_src if k <= l]
        return c[-1] if c else None

    def idx_owner(self, l):
        c = [k for k in self.idx_src if k <= l]
        return c[-1] if c else None

    def mode(self, l):
        if self.ratios[l] == 0:
            return "swa"
        if l in self.kv_src:
            return "full+candidate" if l == self.cand else "full"
        if l in self.idx_src:
            return "reindex"
        return "reuse"
