"""`moeserve bench serve | make-trace | sweep` against live loopback servers (short, bounded runs)."""
import http.server
import json
import os
import re
import threading

import pytest

from conftest import ideal_cached, prom, run_bench

COMMON = ["--duration", "60", "--request-timeout", "30", "--token-lo", "32", "--token-hi", "127"]


def test_random_counters_add_up(fake_server, tmp_path):
    before = fake_server.metrics()
    out = tmp_path / "r.json"
    _, stdout, j = run_bench(["serve", "--base-url", fake_server.base_url, "--isl", "200",
                              "--osl", "16", "--concurrency", "4", "--max-requests", "24",
                              "--warmup", "1", "--gpu-hour-price", "1.41", "--num-gpus", "2"]
                             + COMMON, out, check=0)
    after = fake_server.metrics()
    res = j["results"]
    reqs = j["requests"]
    measured = [r for r in reqs if not r["warmup"]]
    assert len(measured) == 24 and len(reqs) == 24 + 4  # one warm-up per lane
    assert res["num_ok"] == 24 and res["num_errors"] == 0 and not res["failed"]
    # Exact lengths: token-id prompts and ignore_eos + min_tokens.
    for r in reqs:
        assert r["ok"] and r["usage_from_server"]
        assert r["prompt_tokens"] == 200 and r["completion_tokens"] == 16
        assert 0 <= r["ttft_s"] <= r["e2e_s"]
        assert r["num_chunks"] >= 1
    # Summary = sum of per-request server usage.
    assert res["input_tokens"] == sum(r["prompt_tokens"] for r in measured) == 24 * 200
    assert res["output_tokens"] == sum(r["completion_tokens"] for r in measured) == 24 * 16
    # ... and the server's own counters moved by exactly what all requests (warm-up too) used.
    for name, key in [("moeserve:prompt_tokens_total", "prompt_tokens"),
                      ("moeserve:generation_tokens_total", "completion_tokens")]:
        if prom(before, name) is not None:
            assert prom(after, name) - prom(before, name) == sum(r[key] for r in reqs)
    # Throughput and cost arithmetic (spec §2.3 / §3).
    dur = res["duration_s"]
    starts = [r["start_s"] for r in measured]
    ends = [r["start_s"] + r["e2e_s"] for r in measured]
    assert dur == pytest.approx(max(ends) - min(starts), rel=1e-6)
    assert res["total_tok_s_per_gpu"] == pytest.approx(24 * 216 / dur / 2, rel=1e-6)
    assert res["cost_per_1m_total"] == pytest.approx(
        1.41 / (res["total_tok_s_per_gpu"] * 3600 / 1e6), rel=1e-9)
    e2e_per_tok = sorted(r["e2e_s"] / r["completion_tokens"] for r in measured)
    assert res["interactivity_p90"] > 0
    assert 1 / res["interactivity_p90"] <= e2e_per_tok[-1] + 1e-9
    assert res["ttft_ms"]["p50"] <= res["ttft_ms"]["p90"] <= res["ttft_ms"]["p99"]
    assert j["config"]["model"] and j["server"]["models"]["data"]
    assert "Total tok/s per GPU" in stdout
    # The fake engine exposes prefix_cache_queries (in prompt tokens): scraped.
    assert res["prefix_cache"]["available"]
    assert res["prefix_cache"]["queries"] == sum(r["prompt_tokens"] for r in reqs)


def test_chat_endpoint_uses_server_usage(fake_server, tmp_path):
    out = tmp_path / "c.json"
    _, _, j = run_bench(["serve", "--base-url", fake_server.base_url, "--endpoint", "chat",
                         "--isl", "100", "--osl", "8", "--concurrency", "2", "--max-requests",
                         "6"] + COMMON, out, check=0)
    res, reqs = j["results"], j["requests"]
    assert res["num_ok"] == 6
    assert all(r["usage_from_server"] and r["completion_tokens"] == 8 for r in reqs)
    # Chat prompts are text: the server's count (template included) is what is reported.
    assert res["input_tokens"] == sum(r["prompt_tokens"] for r in reqs) > 0


def test_make_trace_hit_ratio_in_band(tmp_path):
    for seed in (1, 2, 3):
        path = tmp_path / f"t{seed}.jsonl"
        _, stdout, _ = run_bench(["make-trace", "-o", path, "--seed", seed], check=0)
        rows = [json.loads(l) for l in open(path)]
        cached = ideal_cached(rows)
        ratio = sum(cached) / sum(r["input_len"] for r in rows)
        assert 0.85 <= ratio <= 0.97, ratio
        assert f"{ratio * 100:.1f}% prefix hits" in stdout
        assert any(r.get("parent_session_id") for r in rows)  # sub-agents fork
        for r in rows:
            assert len(r["hash_ids"]) == (r["input_len"] + 63) // 64
    # Seeded.
    _, _, _ = run_bench(["make-trace", "-o", tmp_path / "again.jsonl", "--seed", 1], check=0)
    assert open(tmp_path / "again.jsonl").read() == open(tmp_path / "t1.jsonl").read()


def test_trace_replay_cached_accounting(fake_server, tmp_path):
    trace = tmp_path / "small.jsonl"
    run_bench(["make-trace", "-o", trace, "--sessions", "3", "--min-turns", "3", "--max-turns",
               "5", "--system-tokens", "512", "--first-user-tokens", "300", "--max-append",
               "300", "--max-output", "24", "--subagent-prob", "0.3", "--subagent-turns", "2",
               "--seed", "5"], check=0)
    rows = [json.loads(l) for l in open(trace)]
    out = tmp_path / "t.json"
    _, _, j = run_bench(["serve", "--base-url", fake_server.base_url, "--trace", trace,
                         "--concurrency", "1", "--idle-scale", "0", "--max-requests",
                         len(rows)] + COMMON, out, check=0)
    res, reqs = j["results"], j["requests"]
    assert res["num_ok"] == len(rows)
    # Every trace request went out once with its exact input and output lengths.
    key = lambda r: (r["session_id"], r["turn"])
    by_key = {key(r): r for r in rows}
    assert sorted(map(key, reqs)) == sorted(by_key)
    for r in reqs:
        t = by_key[key(r)]
        assert r["prompt_tokens"] == t["input_len"] and r["completion_tokens"] == t["output_len"]
    # Cached-token accounting = the trace's shared blocks, replayed in send order.
    sent = [by_key[key(r)] for r in sorted(reqs, key=lambda r: r["start_s"])]
    expected = ideal_cached(sent)
    got = [r["trace_cached_tokens"] for r in sorted(reqs, key=lambda r: r["start_s"])]
    assert got == expected
    assert res["trace_cached_tokens"] == sum(expected) > 0
    assert res["trace_cached_ratio"] == pytest.approx(sum(expected) / sum(
        t["input_len"] for t in rows))
    # The server's cached tokens never exceed the ideal cache.
    assert res["cached_tokens"] <= res["trace_cached_tokens"]


def test_dp_replay_lag_and_mirror(fake_server, tmp_path):
    out = tmp_path / "lag.json"
    _, _, j = run_bench(["serve", "--base-url", fake_server.base_url, "--isl", "64", "--osl", "4",
                         "--concurrency", "1", "--max-requests", "3", "--dp-replay", "lag",
                         "--dp-size", "2", "--lag-seconds", "0.5"] + COMMON, out, check=0)
    ranks = j["results"]["per_dp_rank"]
    assert len(ranks) == 2 and all(r["num_ok"] == 3 for r in ranks)
    first = {rk: min(r["start_s"] for r in j["requests"] if r["dp_rank"] == rk) for rk in (0, 1)}
    assert first[1] - first[0] >= 0.45
    out = tmp_path / "mirror.json"
    _, _, j = run_bench(["serve", "--base-url", fake_server.base_url, "--isl", "64", "--osl", "4",
                         "--max-requests", "3", "--dp-replay", "mirror"] + COMMON, out, check=0)
    assert j["results"]["num_ok"] == 3 and len(j["results"]["per_dp_rank"]) == 1


def test_sweep_writes_json_and_pngs(fake_server, tmp_path):
    pytest.importorskip("matplotlib")
    d = tmp_path / "sweep"
    run_bench(["sweep", "--base-url", fake_server.base_url, "--isl", "128", "--osl", "8",
               "--concurrencies", "1,2,4", "--max-requests", "8", "--out-dir", d,
               "--plot-script", os.path.join(os.path.dirname(__file__), "../../tools/plot_bench.py")]
              + COMMON, check=0)
    for c in (1, 2, 4):
        assert json.load(open(d / f"serve_c{c}.json"))["config"]["concurrency"] == c
    for png in ("throughput_vs_interactivity.png", "latency_percentiles.png",
                "throughput_vs_concurrency.png"):
        assert (d / png).stat().st_size > 1000


class _ErrorServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fail_every):
        super().__init__(("127.0.0.1", 0), _ErrorHandler)
        self.fail_every = fail_every
        self.count = 0
        self.lock = threading.Lock()


class _ErrorHandler(http.server.BaseHTTPRequestHandler):
    """Every `fail_every`-th completion fails (alternating: HTTP 500, then an in-stream error
    event); the rest stream 3 tokens with usage. HTTP/1.0: the body ends at close."""

    def log_message(self, *args):
        pass

    def _json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "err-model", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.count += 1
            n = self.server.count
        fail = n % self.server.fail_every == 0
        if fail and (n // self.server.fail_every) % 2 == 1:
            self._json(500, {"error": {"message": "injected failure", "type": "internal_error"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        out = body["max_tokens"]
        for i in range(out):
            if fail and i == 1:
                self.wfile.write(b'data: {"error": {"message": "injected stream error"}}\n\n')
                break
            chunk = {"choices": [{"index": 0, "text": "x"}], "usage": None}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": out,
                 "total_tokens": len(body["prompt"]) + out}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.mark.parametrize("fail_every,expect_rc", [(4, 1), (20, 0)])
def test_error_rate_gate(tmp_path, fail_every, expect_rc):
    srv = _ErrorServer(fail_every)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        out = tmp_path / "e.json"
        rc, _, j = run_bench(["serve", "--base-url", f"http://127.0.0.1:{srv.server_port}",
                              "--isl", "32", "--osl", "3", "--concurrency", "1",
                              "--max-requests", "40", "--metrics-interval", "0"] + COMMON, out)
    finally:
        srv.shutdown()
        srv.server_close()
    assert rc == expect_rc
    res = j["results"]
    assert res["num_requests"] == 40
    assert res["num_errors"] == 40 // fail_every
    assert res["error_rate"] == pytest.approx(1 / fail_every)
    assert res["failed"] == (expect_rc == 1)
    assert res["num_ok"] == 40 - 40 // fail_every
    errors = [r for r in j["requests"] if not r["ok"]]
    assert any("injected failure" in r["error"] and r["http_status"] == 500 for r in errors)
    if fail_every == 4:
        assert any("injected stream error" in r["error"] for r in errors)
    # Failed requests do not count towards tokens.
    assert res["output_tokens"] == 3 * res["num_ok"]


def _small_trace(tmp_path):
    trace = tmp_path / "small.jsonl"
    run_bench(["make-trace", "-o", trace, "--sessions", "3", "--min-turns", "3", "--max-turns",
               "5", "--system-tokens", "512", "--first-user-tokens", "300", "--max-append",
               "300", "--max-output", "24", "--subagent-prob", "0.3", "--subagent-turns", "2",
               "--seed", "5"], check=0)
    return trace, [json.loads(l) for l in open(trace)]


def test_trace_replay_real_prefix_cache(toy_server, tmp_path):
    """Against the real KV manager: the server's cached tokens are the trace's shared blocks,
    rounded down to the engine's KV block, and /metrics prefix hits equal usage cached tokens."""
    trace, rows = _small_trace(tmp_path)
    out = tmp_path / "toy.json"
    _, _, j = run_bench(["serve", "--base-url", toy_server.base_url, "--trace", trace,
                         "--concurrency", "1", "--idle-scale", "0", "--max-requests", len(rows),
                         "--duration", "120", "--token-lo", "1000", "--token-hi", "4000"],
                        out, check=0)
    res = j["results"]
    assert res["num_ok"] == len(rows)
    assert res["input_tokens"] == sum(r["input_len"] for r in rows)
    for r in j["requests"]:
        assert 0 <= r["server_cached_tokens"] <= r["trace_cached_tokens"]
        assert r["trace_cached_tokens"] - r["server_cached_tokens"] < 512  # block granularity
    assert res["cached_tokens"] > 0.8 * res["trace_cached_tokens"]
    pc = res["prefix_cache"]
    assert pc["available"] and pc["hits"] == res["cached_tokens"]
    assert pc["queries"] == res["input_tokens"]


def _lane_trace(tmp_path):
    """8 sessions of exactly 8 turns, no sub-agents: the 25-75% start band is turns 2..6."""
    trace = tmp_path / "lanes.jsonl"
    run_bench(["make-trace", "-o", trace, "--sessions", "8", "--min-turns", "8", "--max-turns",
               "8", "--system-tokens", "128", "--first-user-tokens", "64", "--min-append", "16",
               "--max-append", "64", "--max-output", "4", "--min-output", "2", "--subagent-prob",
               "0", "--seed", "9"], check=0)
    rows = [json.loads(l) for l in open(trace)]
    assert len(rows) == 64 and {r["turn"] for r in rows} == set(range(8))
    return trace, rows


def _by_lane(reqs):
    lanes = {}
    for r in sorted(reqs, key=lambda r: r["start_s"]):
        lanes.setdefault(r["lane"], []).append(r)
    return lanes


def test_random_lane_start_skips_into_the_first_session(fake_server, tmp_path):
    """AgentX lane warm-up: each lane's first session starts at a uniformly random 25-75% point of
    its turns; the skipped turns are never sent (nor in the idealised cache); later sessions of the
    lane start at turn 0. Without the flag every lane starts at turn 0."""
    trace, rows = _lane_trace(tmp_path)
    turns_of = {}
    for r in rows:
        turns_of.setdefault(r["session_id"], []).append(r["turn"])
    lanes_n = 4
    out = tmp_path / "ls.json"
    # One pass over the trace is at least 4 x 2 (first sessions) + 4 x 8 (the next four) = 40
    # requests, so 40 stays in the first pass (no session repeats) and every lane starts a second
    # session.
    _, _, j = run_bench(["serve", "--base-url", fake_server.base_url, "--trace", trace,
                         "--concurrency", lanes_n, "--idle-scale", "0", "--random-lane-start",
                         "--max-requests", 40, "--seed", 3] + COMMON, out, check=0)
    lanes = _by_lane(j["requests"])
    assert sorted(lanes) == list(range(lanes_n))
    first_turns = []
    for lane, reqs in lanes.items():
        first = reqs[0]
        n = len(turns_of[first["session_id"]])
        assert int(0.25 * n) <= first["turn"] <= int(0.75 * n), (lane, first)
        first_turns.append(first["turn"])
        # The first session continues from there, in order, without the skipped turns.
        mine = [r["turn"] for r in reqs if r["session_id"] == first["session_id"]]
        assert mine == list(range(first["turn"], n))
        # The skipped turns are not in the idealised cache: nothing of this session was sent
        # before (sessions share only the 128-token system prompt = 2 hash blocks, which another
        # lane may have sent).
        assert first["trace_cached_tokens"] <= 128
        # Later sessions of the lane start at turn 0 and go in order.
        later = [r for r in reqs if r["session_id"] != first["session_id"]]
        assert later, lane
        assert later[0]["turn"] == 0
    # The lanes draw their start points independently (fixed seed: not all the same).
    assert len(set(first_turns)) > 1, first_turns
    # No request of a session is sent twice.
    keys = [(r["session_id"], r["turn"]) for r in j["requests"]]
    assert len(keys) == len(set(keys))

    out = tmp_path / "plain.json"
    _, _, j = run_bench(["serve", "--base-url", fake_server.base_url, "--trace", trace,
                         "--concurrency", lanes_n, "--idle-scale", "0", "--max-requests", 8,
                         "--seed", 3] + COMMON, out, check=0)
    for lane, reqs in _by_lane(j["requests"]).items():
        assert reqs[0]["turn"] == 0
