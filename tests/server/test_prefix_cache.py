"""Prefix caching through the server: --block-size, --prefix-replay-tokens, cached-token usage and
the KV residency histograms on /metrics (real model only: the fake engine has no KV pools)."""
import os
import subprocess

import pytest

from conftest import Server, impl

pytestmark = pytest.mark.skipif(impl() != "real", reason="needs the real engine's KV pools")

PROMPT = list(range(10, 70))  # 60 token ids: 3 whole 16-token blocks are cacheable


def complete(srv, prompt):
    status, body = srv.json("POST", "/v1/completions",
                               {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                "logprobs": 1})
    assert status == 200, body
    return body


def test_small_blocks_hit_and_full_replay_equals_miss():
    # A replay that covers the whole hit rebuilds the sliding window exactly (docs/engine.md).
    srv = Server(api_key=None, args=["--block-size", "16", "--prefix-replay-tokens", "4096"])
    try:
        miss = complete(srv, PROMPT)
        assert miss["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0
        hit = complete(srv, PROMPT)
        assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] == 48
        assert hit["choices"][0]["text"] == miss["choices"][0]["text"]
        assert (hit["choices"][0]["logprobs"]["token_logprobs"]
                == miss["choices"][0]["logprobs"]["token_logprobs"])
        assert srv.metric("moeserve:prefix_cache_hits") == 48
        # The hit touched three cached blocks: three reuse-gap samples; nothing was evicted.
        assert srv.metric("moeserve:kv_block_reuse_gap_seconds_count") == 3
        assert srv.metric("moeserve:kv_block_lifetime_seconds_count") == 0
    finally:
        srv.stop()


def test_prefix_caching_off_and_bad_block_size():
    srv = Server(api_key=None, args=["--block-size", "16", "--no-enable-prefix-caching"])
    try:
        complete(srv, PROMPT)
        again = complete(srv, PROMPT)
        assert again["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0
    finally:
        srv.stop()
    # 15 splits the ratio-2 compressor groups of the tiny model: a clear error, exit != 0.
    binary = os.environ.get("MOESERVE_BIN", "build/cpu-debug/bin/moeserve")
    r = subprocess.run([binary, "serve", "--port", "0", "--block-size", "15"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--block-size 15 is not a multiple" in (r.stdout + r.stderr)
