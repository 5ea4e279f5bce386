"""`moeserve bench serve` against the real `moeserve serve` (the embedded tiny model, random weights,
the real EngineCore with its prefix cache) on loopback. Short, bounded runs: CI runs these in the
ASan Debug build on a 2-core box.

The server's KV block is kv::kBlockTokens = 256 tokens (a compile-time constant; `moeserve serve` has
no block-size option), so the cached-token test builds a trace whose shared prefixes are known
numbers of 256-token blocks out of the bench's 64-token hash blocks.
"""
import json
import math

import pytest

from conftest import prom, run_bench

SERVER_BLOCK = 256  # kv::kBlockTokens
# Token ids well inside the tiny model's 4096-token vocabulary, away from the special tokens.
TOKENS = ["--token-lo", "1000", "--token-hi", "4000"]
BOUNDS = ["--duration", "120", "--request-timeout", "60"]


def np_percentile(values, q):
    """numpy.percentile's default (linear interpolation between closest ranks), independently."""
    v = sorted(values)
    pos = q / 100 * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def check_percentiles(summary_ms, values_s):
    assert summary_ms["count"] == len(values_s)
    for q in (50, 90, 99):
        assert summary_ms[f"p{q}"] == pytest.approx(np_percentile(values_s, q) * 1e3, rel=1e-9)
    assert summary_ms["mean"] == pytest.approx(sum(values_s) / len(values_s) * 1e3, rel=1e-9)
    assert summary_ms["min"] == pytest.approx(min(values_s) * 1e3, rel=1e-9)
    assert summary_ms["max"] == pytest.approx(max(values_s) * 1e3, rel=1e-9)


def test_real_counters_add_up(real_server, tmp_path):
    """Tokens in the JSON = the server's per-request usage = the deltas of its /metrics counters;
    percentiles and throughput recomputed from the per-request records."""
    before = real_server.metrics()
    out = tmp_path / "real.json"
    _, stdout, j = run_bench(["serve", "--base-url", real_server.base_url, "--isl", "40", "--osl",
                              "5", "--concurrency", "2", "--warmup", "1", "--max-requests", "6",
                              "--num-gpus", "2", "--gpu-hour-price", "1.41"] + TOKENS + BOUNDS,
                             out, check=0)
    after = real_server.metrics()
    res, reqs = j["results"], j["requests"]
    measured = [r for r in reqs if not r["warmup"]]
    assert len(measured) == 6 and len(reqs) == 6 + 2  # one warm-up per lane
    assert res["num_ok"] == 6 and res["num_errors"] == 0 and not res["failed"]
    for r in reqs:
        # Token-id prompts are exact; ignore_eos + min_tokens make the output exact.
        assert r["ok"] and r["usage_from_server"], r
        assert r["prompt_tokens"] == 40 and r["completion_tokens"] == 5
        assert r["num_chunks"] >= 1 and 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["server_cached_tokens"] == 0  # fresh prompts shorter than one KV block
    assert res["input_tokens"] == sum(r["prompt_tokens"] for r in measured) == 6 * 40
    assert res["output_tokens"] == sum(r["completion_tokens"] for r in measured) == 6 * 5
    # The server's counters moved by what every request (warm-up included) used, both as this test
    # reads them and as the bench scraped them.
    for name, key, scraped in [("moeserve:prompt_tokens_total", "prompt_tokens", "prompt_tokens"),
                               ("moeserve:generation_tokens_total", "completion_tokens",
                                "generation_tokens")]:
        assert prom(before, name) is not None, f"{name} missing from /metrics"
        delta = prom(after, name) - prom(before, name)
        assert delta == sum(r[key] for r in reqs), name
        assert res["server_counters"][scraped] == delta
    pc = res["prefix_cache"]
    assert pc["available"] and pc["hits"] == 0
    assert pc["queries"] == sum(r["prompt_tokens"] for r in reqs)
    # Percentiles over the measured records (numpy's interpolation, recomputed here).
    check_percentiles(res["ttft_ms"], [r["ttft_s"] for r in measured])
    check_percentiles(res["e2e_ms"], [r["e2e_s"] for r in measured])
    check_percentiles(res["tpot_ms"], [r["tpot_s"] for r in measured])
    for r in measured:
        assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / 4, rel=1e-9)
    e2e_per_tok = [r["e2e_s"] / r["completion_tokens"] for r in measured]
    assert res["interactivity_p90"] == pytest.approx(1 / np_percentile(e2e_per_tok, 90), rel=1e-9)
    assert res["decode_tok_s_per_user_p50"] == pytest.approx(1e3 / res["tpot_ms"]["p50"], rel=1e-9)
    # Throughput and cost (spec §2.3): cached + uncached input + output over the request window.
    dur = max(r["start_s"] + r["e2e_s"] for r in measured) - min(r["start_s"] for r in measured)
    assert res["duration_s"] == pytest.approx(dur, rel=1e-9)
    assert res["total_tok_s_per_gpu"] == pytest.approx(6 * (40 + 5) / dur / 2, rel=1e-9)
    assert res["cost_per_1m_total"] == pytest.approx(
        1.41 / (res["total_tok_s_per_gpu"] * 3600 / 1e6), rel=1e-9)
    assert j["server"]["model"] == j["config"]["model"] == "moeserve-tiny-random"
    assert "Total tok/s per GPU" in stdout


# (session, parent, turn, input_len, hash ids) — 64-token hash blocks; the server caches 256-token
# blocks once a request has computed them. Expected cached tokens per request, as the ideal cache
# (longest run of leading hash ids already sent) and as the server (that run rounded down to whole
# 256-token blocks, every one of which an earlier prompt computed in full):
SHARED_TRACE = [
    # a0: 270 tokens; computes block 0 (tokens 0..255) in full.
    ("a", None, 0, 270, [1, 2, 3, 4, 5], 0, 0),
    # a1: shares ids 1-4 = 256 tokens = exactly one server block; computes its block 1 (256..511).
    ("a", None, 1, 530, [1, 2, 3, 4, 10, 11, 12, 13, 14], 256, 256),
    # a2: shares 8 ids = 512 tokens = two server blocks.
    ("a", None, 2, 520, [1, 2, 3, 4, 10, 11, 12, 13, 20], 512, 512),
    # b0: shares 3 ids = 192 tokens: less than one server block, so the server hits nothing.
    ("b", None, 0, 200, [1, 2, 3, 30], 192, 0),
    # c0 (a sub-agent of a): shares a1's 9 ids = 576 tokens for the ideal cache, but tokens
    # 512..767 were never a full computed block (a1: 530 prompt + 4 output tokens), so the server
    # hits 512.
    ("c", "a", 0, 600, [1, 2, 3, 4, 10, 11, 12, 13, 14, 40], 576, 512),
]


def test_real_cached_tokens_match_shared_blocks(real_server, tmp_path):
    trace = tmp_path / "shared.jsonl"
    with open(trace, "w") as f:
        for sid, parent, turn, n, ids, _, _ in SHARED_TRACE:
            assert len(ids) == (n + 63) // 64
            row = {"session_id": sid, "turn": turn, "input_len": n, "output_len": 4,
                   "hash_ids": ids, "idle_s": 0}
            if parent:
                row["parent_session_id"] = parent
            f.write(json.dumps(row) + "\n")
    before = real_server.metrics()
    out = tmp_path / "shared.json"
    _, _, j = run_bench(["serve", "--base-url", real_server.base_url, "--trace", trace,
                         "--concurrency", "1", "--max-requests", len(SHARED_TRACE)]
                        + TOKENS + BOUNDS, out, check=0)
    after = real_server.metrics()
    res, reqs = j["results"], j["requests"]
    assert res["num_ok"] == len(SHARED_TRACE)
    sent = sorted(reqs, key=lambda r: r["start_s"])
    assert [(r["session_id"], r["turn"]) for r in sent] == [(t[0], t[2]) for t in SHARED_TRACE]
    for r, (_, _, _, n, _, ideal, server) in zip(sent, SHARED_TRACE):
        assert r["prompt_tokens"] == n and r["completion_tokens"] == 4
        assert r["trace_cached_tokens"] == ideal, r
        assert r["server_cached_tokens"] == server, r
        assert r["server_cached_tokens"] == ideal // SERVER_BLOCK * SERVER_BLOCK
    assert res["trace_cached_tokens"] == sum(t[5] for t in SHARED_TRACE) == 1536
    assert res["cached_tokens"] == sum(t[6] for t in SHARED_TRACE) == 1280
    total_in = sum(t[3] for t in SHARED_TRACE)
    assert res["input_tokens"] == total_in
    assert res["trace_cached_ratio"] == pytest.approx(1536 / total_in)
    assert res["trace_file_ideal_hit_ratio"] == pytest.approx(1536 / total_in)
    # /metrics: prefix-cache hits are the usage cached tokens; queries the prompt tokens.
    hits = prom(after, "moeserve:prefix_cache_hits") - prom(before, "moeserve:prefix_cache_hits")
    queries = (prom(after, "moeserve:prefix_cache_queries")
               - prom(before, "moeserve:prefix_cache_queries"))
    assert hits == 1280 and queries == total_in
    pc = res["prefix_cache"]
    assert pc["available"] and pc["hits"] == 1280 and pc["queries"] == total_in
    assert pc["hit_ratio"] == pytest.approx(1280 / total_in)
    # Prompt tokens the server counts include the cached ones (InferenceX: all input counts).
    assert (prom(after, "moeserve:prompt_tokens_total")
            - prom(before, "moeserve:prompt_tokens_total")) == total_in


def test_real_dp_replay_single_rank(real_server, tmp_path):
    """--dp-replay against one server (no data parallelism yet): mirror with --dp-size 1 is a plain
    run; lag with --dp-size 2 runs two identical request streams into the one server, rank 1
    starting --lag-seconds later, with prompts salted per rank (no cross-rank cache hits: the
    prompts are longer than one 256-token server block, so an unsalted copy would hit it)."""
    out = tmp_path / "mirror.json"
    _, _, j = run_bench(["serve", "--base-url", real_server.base_url, "--isl", "24", "--osl", "2",
                         "--max-requests", "2", "--dp-replay", "mirror"] + TOKENS + BOUNDS,
                        out, check=0)
    res = j["results"]
    assert res["num_ok"] == 2 and len(res["per_dp_rank"]) == 1
    assert res["per_dp_rank"][0]["input_tokens"] == res["input_tokens"] == 48
    assert all(r["dp_rank"] == 0 for r in j["requests"])

    before = real_server.metrics()
    out = tmp_path / "lag.json"
    _, _, j = run_bench(["serve", "--base-url", real_server.base_url, "--isl", "264", "--osl",
                         "2", "--max-requests", "1", "--dp-replay", "lag", "--dp-size", "2",
                         "--lag-seconds", "1"] + TOKENS + BOUNDS, out, check=0)
    after = real_server.metrics()
    res, reqs = j["results"], j["requests"]
    ranks = res["per_dp_rank"]
    assert len(ranks) == 2 and [r["num_ok"] for r in ranks] == [1, 1]
    assert res["num_ok"] == 2 and res["input_tokens"] == 2 * 264 == sum(
        r["input_tokens"] for r in ranks)
    first = {k: min(r["start_s"] for r in reqs if r["dp_rank"] == k) for k in (0, 1)}
    assert first[1] - first[0] >= 0.95
    # The same session on each rank.
    assert len({r["session_id"] for r in reqs}) == 1
    # Rank 1's copy is salted: the shared server sees no prefix hit between the ranks.
    assert all(r["server_cached_tokens"] == 0 for r in reqs)
    assert (prom(after, "moeserve:prompt_tokens_total")
            - prom(before, "moeserve:prompt_tokens_total")) == 2 * 264
    assert (prom(after, "moeserve:prefix_cache_hits")
            - prom(before, "moeserve:prefix_cache_hits")) == 0
