"""Tests of the numpy oracle itself (tools/reference).  Run: python -m pytest tests/reference -q"""
import math
import os
import sys

import numpy as np
import ml_dtypes
import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tools.reference import formats as F  # noqa: E402
from tools.reference.config import Config  # noqa: E402
from tools.reference.dspark import draft  # noqa: E402
from tools.reference.engram import EngramHasher, engram_multipliers, engram_primes, FULL_SIZE_MULTIPLIERS  # noqa: E402
from tools.reference.make_tiny import TINY_CONFIG, generate  # noqa: E402
from tools.reference.model import Model, rope_freqs, sinkhorn, topk_mask, yarn_correction_range  # noqa: E402
from tools.reference.safetensors_np import Tensor, read_dir, read_file, write_file  # noqa: E402

NAN = float("nan")


# ============================================================================ formats
def test_e4m3_round_goldens():
    x = np.array([0.0, -0.0, 1.0, 1.0625, 1.1875, 448.0, 449.0, 463.9, 464.0, 1e9, np.inf, -np.inf,
                  2.0**-9, 2.0**-10, 3 * 2.0**-10, 2.0**-11, 2.0**-6, 0.875 * 2.0**-6, -17.0, NAN])
    want = np.array([0.0, -0.0, 1.0, 1.0, 1.25, 448.0, 448.0, 448.0, 448.0, 448.0, 448.0, -448.0,
                     2.0**-9, 0.0, 2.0**-8, 0.0, 2.0**-6, 0.875 * 2.0**-6, -16.0, NAN])
    got = F.e4m3_round(x)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.signbit(got[1])


def test_e4m3_matches_ml_dtypes_on_float32():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100000) * np.exp2(rng.integers(-14, 10, 100000))).astype(np.float32)
    ref = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert np.array_equal(F.e4m3_round(x), ref)
    assert np.array_equal(F.e4m3_decode(F.e4m3_encode(ref)), ref)


def test_bf16_round_single_rounding():
    assert F.bf16_round(1.0 + 2.0**-8 + 2.0**-40) == 1.0078125  # ml_dtypes double-rounds to 1.0
    assert F.bf16_round(1.0 + 2.0**-8) == 1.0  # tie -> even
    assert F.bf16_round(1.0 + 3 * 2.0**-8) == 1.015625
    assert math.isinf(F.bf16_round(3.5e38))
    assert np.isnan(F.bf16_round(NAN))
    x = np.random.default_rng(1).standard_normal(10000).astype(np.float32)
    assert np.array_equal(F.bf16_round(x), x.astype(ml_dtypes.bfloat16).astype(np.float64))


def test_e2m1_round_ties_saturation_nan():
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.3, 0.7, 5.01, 6.0, 7.0, 1e9, -0.25, -3.5, -100, NAN])
    want = np.array([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.5, 0.5, 6.0, 6.0, 6.0, 6.0, -0.0, -4.0, -6.0, NAN])
    assert np.array_equal(F.e2m1_round(x), want, equal_nan=True)


def test_fp4_packing():
    vals = np.array([[1.0, -0.5, 6.0, 0.0]])
    packed = F.pack_fp4(F.e2m1_encode(vals))
    assert packed.dtype == np.int8
    assert list(packed.view(np.uint8)[0]) == [0x92, 0x07]  # elem0 low nibble, elem1 high nibble
    assert np.array_equal(F.unpack_fp4(packed), vals)


def test_ue8m0():
    assert list(F.ue8m0_decode(np.array([127, 128, 0, 254], np.uint8))) == [1.0, 2.0, 2.0**-127, 2.0**127]
    assert np.isnan(F.ue8m0_decode(np.array([255], np.uint8))[0])
    assert list(F.ue8m0_encode(np.array([1.0, 0.5, 2.0**-20]))) == [127, 126, 107]


def test_pow2_scale_from_bits():
    v = np.array([1.0, 1.0000001, 0.75, 2.0**-126, 3.0], np.float32)
    assert list(F.pow2_ceil_from_f32_bits(v)) == [1.0, 2.0, 1.0, 2.0**-126, 4.0]


def test_fq_fp8_goldens():
    x = np.zeros(64)
    x[0], x[1], x[2] = 448.0, 1.0625, -3.0          # block 0: s = 1
    x[32], x[33], x[34] = 896.0, 3.0, 1.0625        # block 1: s = 2
    y = F.fq_fp8(x, 32)
    assert y[0] == 448 and y[1] == 1.0 and y[2] == -3.0
    assert y[32] == 896 and y[33] == 3.0 and y[34] == 1.0  # 0.53125 -> 0.5 (tie to even)
    # amax clamp 1e-4: s = 2^ceil(log2(1e-4/448)) = 2^-22; tiny values quantize on that grid
    z = np.full(32, 1e-6)
    s = 2.0**-22
    assert np.allclose(F.fq_fp8(z), F.e4m3_round(1e-6 / s) * s)
    assert np.all(F.fq_fp8(np.zeros(32)) == 0)
    # amax slightly above 448*2^k -> next power of two
    w = np.zeros(32)
    w[0] = 449.0
    assert F.fq_fp8(w)[0] == 448.0  # s = 2; 449/2 = 224.5 -> 224 (spacing 16 in [128,256)) -> 448
    nanb = np.zeros(32)
    nanb[3] = NAN
    assert np.all(np.isnan(F.fq_fp8(nanb)))  # NaN poisons its block


def test_fq_fp4_e4m3_goldens():
    x = np.array([6.0, 0.25, 0.75, 2.5, 5.0, -3.5, 1.25, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    assert np.array_equal(F.fq_fp4_e4m3(x, 16), [6, 0, 1, 2, 4, -4, 1] + [0] * 9)
    assert np.all(F.fq_fp4_e4m3(np.zeros(16)) == 0)  # s = 2^-9, no division by zero
    # amax 7: s = e4m3(7/6 = 1.1667) = 1.125; 7/1.125 = 6.22 -> saturates to 6 -> 6.75
    y = np.zeros(16)
    y[0] = 7.0
    assert F.fq_fp4_e4m3(y)[0] == 6.75
    # tiny amax: max(amax, 6*2^-9)/6 = 2^-9 (e4m3 min subnormal)
    t = np.zeros(16)
    t[0] = 1e-4
    assert F.fq_fp4_e4m3(t)[0] == F.e2m1_round(1e-4 / 2.0**-9) * 2.0**-9


def test_fq_fp4_ue8m0_goldens():
    x = np.zeros(32)
    x[0], x[1] = 6.0, 0.75
    y = F.fq_fp4_ue8m0(x)
    assert y[0] == 6.0 and y[1] == 1.0
    x[0] = 6.01  # s = 2 -> 3.005 -> 3 -> 6 ; 0.75/2 = .375 -> .5 -> 1
    y = F.fq_fp4_ue8m0(x)
    assert y[0] == 6.0 and y[1] == 1.0
    assert np.all(F.fq_fp4_ue8m0(np.zeros(32)) == 0)


def test_weight_quant_roundtrip():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 70))
    q, s = F.quant_fp8_block(w)
    assert s.shape == (2, 3)
    d = F.dequant_fp8_block(q, s)
    assert np.max(np.abs(d - w) / (np.abs(w) + 1e-3)) < 0.07
    w4 = rng.standard_normal((8, 64))
    q4, s4 = F.quant_mxfp4(w4)
    assert q4.shape == (8, 32) and s4.shape == (8, 2)
    d4 = F.dequant_mxfp4(q4, s4)
    assert np.max(np.abs(d4 - w4)) < 0.5


# ============================================================================ safetensors
def test_safetensors_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    ts = {
        "a": Tensor("BF16", rng.standard_normal((3, 4)).astype(np.float32).astype(ml_dtypes.bfloat16)),
        "b": Tensor("F16", rng.standard_normal(5).astype(np.float16)),
        "c": Tensor("F32", rng.standard_normal((2, 2)).astype(np.float32)),
        "d": Tensor("F8_E4M3", np.array([1.0, -2.0, 448.0], np.float32).astype(ml_dtypes.float8_e4m3fn)),
        "e": Tensor("F8_E8M0", np.array([127, 0, 254], np.uint8)),
        "f": Tensor("I8", np.array([-1, 2], np.int8)),
        "g": Tensor("U8", np.array([255], np.uint8)),
        "h": Tensor("I32", np.array([7, -7], np.int32)),
        "i": Tensor("I64", np.array([[1 << 40]], np.int64)),
    }
    write_file(str(tmp_path / "x.safetensors"), ts, {"k": "v"})
    back = read_file(str(tmp_path / "x.safetensors"))
    for k, t in ts.items():
        assert back[k].dtype == t.dtype
        assert back[k].array.tobytes() == np.ascontiguousarray(t.array).tobytes()
        assert back[k].array.shape == t.array.shape
    # sharded
    import json
    write_file(str(tmp_path / "s1.safetensors"), {"a": ts["a"]})
    write_file(str(tmp_path / "s2.safetensors"), {"c": ts["c"]})
    sd = tmp_path / "sh"
    sd.mkdir()
    os.rename(tmp_path / "s1.safetensors", sd / "s1.safetensors")
    os.rename(tmp_path / "s2.safetensors", sd / "s2.safetensors")
    (sd / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "c": "s2.safetensors"}}))
    assert set(read_dir(str(sd))) == {"a", "c"}


# ============================================================================ spec constants
def test_full_size_engram_primes():
    p = engram_primes([1, 14], 4, 8, 16000000)
    assert p[1][0] == [16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183]
    assert sum(sum(o) for o in p[1]) == 384006168
    assert sum(sum(o) for o in p[14]) == 384016682


def test_tiny_engram_primes():
    p = engram_primes([1, 4], 4, 2, 101)
    assert p[1] == [[101, 103], [107, 109], [113, 127]]
    assert p[4] == [[131, 137], [139, 149], [151, 157]]
    assert sum(map(sum, p[1])) == 660 and sum(map(sum, p[4])) == 864


def test_full_size_multipliers():
    for layer, want in FULL_SIZE_MULTIPLIERS.items():
        assert [int(v) for v in engram_multipliers(layer, 99092, 4)] == want


def test_yarn_correction_range():
    assert yarn_correction_range(32, 1, 64, 160000.0, 65536) == (15, 25)
    f = rope_freqs(64, 160000.0, {"factor": 16, "original_max_position_embeddings": 65536,
                                  "beta_fast": 32, "beta_slow": 1})
    base = 1.0 / 160000.0 ** (np.arange(0, 64, 2) / 64)
    assert np.allclose(f[:15], base[:15])          # high-frequency dims unchanged
    assert np.allclose(f[25:], base[25:] / 16)     # low-frequency dims interpolated


def test_sinkhorn_doubly_stochastic():
    rng = np.random.default_rng(0)
    C = sinkhorn(rng.standard_normal((50, 4, 4)), 20, 1e-6)
    assert np.all(C > 0)
    assert np.allclose(C.sum(-2), 1.0, atol=1e-5)   # columns (last normalization)
    assert np.allclose(C.sum(-1), 1.0, atol=1e-3)   # rows
    # sharper logits converge more slowly in 20 iterations (spec behaviour, not a bug)
    C = sinkhorn(rng.standard_normal((50, 4, 4)) * 3, 20, 1e-6)
    assert np.allclose(C.sum(-2), 1.0, atol=1e-5) and np.allclose(C.sum(-1), 1.0, atol=5e-2)


def test_topk_tie_rule():
    s = np.array([[0.0, 0.0, 1.0, 0.0, 0.0, -1.0]])
    m = topk_mask(s, np.ones_like(s, bool), 3)
    assert list(np.nonzero(m[0])[0]) == [0, 1, 2]  # ties -> lowest index
    allowed = np.array([[False, True, True, False, False, True]])
    assert list(np.nonzero(topk_mask(s, allowed, 5)[0])[0]) == [1, 2, 5]  # k = min(k, n_allowed)


# ============================================================================ tiny model
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    generate(str(d), seed=0)
    return Model.from_dir(str(d)), str(d)


def test_checkpoint_layout(tiny):
    _, d = tiny
    raw = read_dir(d)
    c = Config(TINY_CONFIG)
    assert raw["embed.weight"].dtype == "BF16" and raw["embed.weight"].array.shape == (256, 64)
    assert raw["layers.0.attn.wq_b.weight"].dtype == "F8_E4M3"
    assert raw["layers.0.attn.wq_b.scale"].array.shape == (c.H * c.hd // 32, c.Q // 32)
    assert raw["layers.0.attn.wo_a.weight"].array.shape == (c.G * c.O, c.H * c.hd // c.G)
    assert raw["layers.3.ffn.experts.7.w2.weight"].dtype == "I8"
    assert raw["layers.3.ffn.experts.7.w2.weight"].array.shape == (64, 16)
    assert raw["layers.3.ffn.experts.7.w2.scale"].array.shape == (64, 1)
    assert raw["layers.1.engram.table.weight"].array.shape == (660, 32)
    assert raw["layers.4.engram.table.scale"].array.shape == (864, 1)
    assert raw["layers.4.engram.wkv.weight"].array.shape == (64 * 5, 3 * 2 * 32)
    assert "layers.2.attn.compressor.wgate.weight" in raw and "layers.6.attn.compressor.wgate.weight" not in raw
    assert "layers.8.attn.indexer.wq_b.weight" in raw and "layers.8.attn.indexer.wk.weight" not in raw
    assert "layers.3.attn.indexer.wq_b.weight" not in raw
    assert raw["mtp.0.main_proj.weight"].array.shape == (64, 192)
    assert raw["mtp.2.confidence_head.proj.weight"].array.shape == (1, 72)
    assert "mtp.1.ffn.gate.bias_vl" not in raw and "mtp.1.ffn.experts.3.w1.weight" in raw
    assert not any(k.startswith("hc_head") for k in raw)


def test_act_quant_mxfp8_before_block_scaled_linears(tiny):
    """Spec §5 [UNCERTAIN]: inputs of FP8 / MXFP4 linears are fq_fp8 b32; BF16/F32 linears are not."""
    m, _ = tiny
    bs = m.block_scaled
    for name in ["layers.0.attn.wq_a", "layers.0.attn.wq_b", "layers.0.attn.wkv", "layers.0.attn.wo_a",
                 "layers.0.attn.wo_b", "layers.2.attn.indexer.wq_b", "layers.0.ffn.shared_experts.w2",
                 "layers.3.ffn.experts.7.w1", "layers.3.ffn.experts.7.w2", "layers.4.engram.wkv",
                 "mtp.0.main_proj", "mtp.2.attn.wq_a", "mtp.1.ffn.experts.0.w3"]:
        assert name in bs, name
    for name in ["head", "embed", "layers.2.attn.compressor.wkv", "layers.2.attn.compressor.wgate",
                 "layers.2.attn.indexer.wk", "layers.2.attn.indexer.weights_proj", "layers.0.ffn.gate",
                 "layers.1.engram.table", "mtp.2.markov_head.head"]:
        assert name not in bs, name
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 64)) * 3.0
    for name in ["layers.0.attn.wq_a", "layers.3.ffn.experts.7.w1", "mtp.0.attn.wkv"]:
        W = m.w[name + ".weight"]
        y = m.lin(x, name)
        assert np.array_equal(y, F.fq_fp8(x, 32) @ W.T)
        assert not np.allclose(y, x @ W.T, rtol=1e-6, atol=0.0)
    g = m.w["layers.0.ffn.gate.weight"]
    assert np.array_equal(m.lin(x, "layers.0.ffn.gate"), x @ g.T)
    off = Model(m.cfg, m.w, block_scaled=bs, act_quant=False)
    assert np.array_equal(off.lin(x, "layers.0.attn.wq_a"), x @ m.w["layers.0.attn.wq_a.weight"].T)
    ids = [5, 17, 3, 99, 42, 7, 1, 200]
    on_logits, off_logits = m.logits_all_positions(ids), off.logits_all_positions(ids)
    assert np.all(np.isfinite(on_logits)) and not np.allclose(on_logits, off_logits, rtol=1e-9, atol=0.0)


def test_engram_hash_blocking(tiny):
    m, _ = tiny
    h = m.hasher
    cids = np.array([10, 11, 12, 13, 14, -1, 16, 17, 18, 19], np.int64)
    tok = h.shifted_tokens(cids)
    pad = 2
    assert list(tok[0]) == [10, pad, pad, pad]
    assert list(tok[2]) == [12, 11, 10, pad]
    assert list(tok[5]) == [pad] * 4          # DEAD at shift 0 blocks everything
    assert list(tok[6]) == [16, pad, pad, pad]
    assert list(tok[8]) == [18, 17, 16, pad]  # DEAD at shift 3
    assert list(tok[9]) == [19, 18, 17, 16]
    ids = h.hash_ids(cids, 1)
    mm = [int(v) for v in h.mult[1]]
    hv = (19 * mm[0]) ^ (18 * mm[1])
    assert ids[9, 0] == hv % 101 and ids[9, 1] == hv % 103 + 101
    hv = hv ^ (17 * mm[2]) ^ (16 * mm[3])
    assert ids[9, 5] == hv % 127 + 101 + 103 + 107 + 109 + 113
    assert ids.max() < 660


def test_production_equals_oracle_short(tiny):
    m, _ = tiny
    rng = np.random.default_rng(5)
    for T in (1, 3, 8):
        ids = rng.integers(3, 255, T)
        img = np.zeros(T, bool)
        img[T // 2] = T > 2
        a = m.forward(ids, "oracle", img)
        b = m.forward(ids, "production", img)
        assert np.array_equal(a["logits"], b["logits"])
        assert np.array_equal(m.logits_all_positions(ids)[-1], m.prefill_production(ids))


def test_production_differs_long_but_shares_caches(tiny):
    m, _ = tiny
    ids = np.random.default_rng(6).integers(3, 255, 30)
    a = m.forward(ids, "oracle")
    b = m.forward(ids, "production")
    assert list(b["rows"]) == list(range(22, 30))
    assert np.array_equal(a["encoder_out"], b["encoder_out"])
    assert np.array_equal(a["caches"][6]["main"], b["caches"][6]["main"])
    assert np.array_equal(a["caches"][6]["idxk"], b["caches"][6]["idxk"])
    assert np.isfinite(b["logits"]).all()


def test_no_nan_40_steps_and_causal(tiny):
    m, _ = tiny
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 256, 48)  # 8-token prompt + 40 random decode tokens
    L = m.logits_all_positions(ids)
    assert np.isfinite(L).all() and np.abs(L).max() < 1e3
    for t in (8, 21, 33, 47):  # causality: row t == last row of a forward over ids[:t+1]
        assert np.allclose(m.logits_all_positions(ids[: t + 1])[-1], L[t], rtol=1e-9, atol=1e-9)


def test_all_modes_exercised_80(tiny):
    m, _ = tiny
    c = m.cfg
    st = m.forward(np.random.default_rng(8).integers(3, 255, 96), "oracle")
    info = st["info"]
    modes = {info[l]["mode"] for l in range(c.L)}
    assert modes == {"swa", "full", "reuse", "full+candidate", "reindex"}
    assert 96 > c.W
    for l in (2, 4):  # ratio-2 full-context indexing: visible entries > top-k
        assert info[l]["n_visible_last"] == 48 > c.topk and info[l]["selected_last"] == c.topk
    assert info[6]["n_visible_last"] == 96
    pool = c.cand_topk_blocks * c.cand_bs
    assert info[6]["cand_pool_last"] == pool < 96
    for l in (8, 10):
        assert info[l]["allowed_last"] == pool and info[l]["selected_last"] == c.topk
        assert info[l]["idx_owner"] == l and info[l]["kv_owner"] == 6
    assert info[9]["idx_owner"] == 8 and info[3]["kv_owner"] == 2
    # newest block is always pinned
    newest = (96 - 1) // c.cand_bs
    assert st["cand_mask"][-1, newest * c.cand_bs]


def test_dspark_draft(tiny):
    m, _ = tiny
    ids = np.random.default_rng(9).integers(3, 255, 20)
    for mode in ("oracle", "production"):
        st = m.forward(ids, mode)
        anchor = int(np.argmax(st["logits"][-1]))
        r = draft(m, st["main_hidden"], st["main_hidden_pos"], anchor)
        assert list(r["ctx_pos"]) == list(range(12, 20))
        assert list(r["positions"]) == [20, 21, 22, 23, 24]
        assert r["U"].shape == (5, 256) and np.isfinite(r["l"]).all()
        assert np.all((r["c"] > 0) & (r["c"] < 1))
        prev = anchor
        for i in range(5):
            mk = m.w["mtp.2.markov_head.head.weight"] @ m.w["mtp.2.markov_head.embed.weight"][prev]
            assert np.allclose(r["l"][i], r["U"][i] + mk)
            assert r["d"][i] == np.argmax(r["l"][i])
            prev = r["d"][i]
    # the ring holds only the last W committed positions: older taps are ignored
    a = m.forward(ids, "oracle")
    ra = draft(m, a["main_hidden"], a["main_hidden_pos"], 7)
    rb = draft(m, a["main_hidden"][-8:], a["main_hidden_pos"][-8:], 7)
    assert np.array_equal(ra["U"], rb["U"]) and np.array_equal(ra["c"], rb["c"])


def test_cli_dump(tiny, tmp_path):
    _, d = tiny
    from tools.reference.cli import main
    out = tmp_path / "o.npz"
    main(["dump", "--model", d, "--ids", "5,6,7,8,9,10,11,12,13,14", "--mode", "production",
          "--out", str(out), "--draft", "--image-pos", "3"])
    z = np.load(out)
    assert z["logits"].shape == (8, 256) and z["draft_d"].shape == (5,)
    assert z["image_mask"][3] == 1


def test_swa_window_is_exactly_W(tiny):
    m, _ = tiny
    W = m.cfg.W
    ids = np.random.default_rng(10).integers(3, 255, 30)
    t = 25
    base = m.forward(ids, "oracle")["layer_out"][0][1][t]
    out_win = ids.copy()
    out_win[t - W] = (out_win[t - W] + 1) % 256
    assert np.array_equal(m.forward(out_win, "oracle")["layer_out"][0][1][t], base)
    in_win = ids.copy()
    in_win[t - W + 1] = (in_win[t - W + 1] + 1) % 256
    assert not np.array_equal(m.forward(in_win, "oracle")["layer_out"][0][1][t], base)


def test_global_visibility_and_selection(tiny):
    m, _ = tiny
    T = 40
    st = m.forward(np.random.default_rng(11).integers(3, 255, T), "oracle")
    for l, r in ((2, 2), (4, 2), (6, 1), (8, 1)):
        sel = st["sel"][l]
        for t in range(T):
            nv = (t + 1) // r
            assert not sel[t, nv:].any()
            assert sel[t].sum() == min(m.cfg.topk, nv if l != 8 else (st["cand_mask"][t, :nv]).sum())
    # Reindex selections stay inside the candidate pool
    assert not (st["sel"][8] & ~st["cand_mask"]).any()


def test_cli_layers(tiny, tmp_path):
    _, d = tiny
    from tools.reference.cli import main
    out = tmp_path / "o.safetensors"
    main(["dump", "--model", d, "--ids", ",".join(str(i) for i in range(3, 23)), "--mode", "production",
          "--layers", "--out", str(out)])
    z = read_file(str(out))
    assert z["layer_out.5"].array.shape == (20, 4, 64) and z["layer_out.6"].array.shape == (8, 4, 64)
    assert list(z["layer_rows.11"].array) == list(range(12, 20))
