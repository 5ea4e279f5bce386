"""Concurrency, client disconnects and SIGTERM drain against a live server."""
import concurrent.futures
import json
import signal
import socket
import threading
import time

import pytest

from conftest import Server, impl

# The real server runs the embedded model on the CPU (ASan Debug in CI): keep generations short.
STREAM_TOKENS = 4 if impl() == "real" else 32


def raw_stream_request(server, body: dict) -> socket.socket:
    payload = json.dumps(body).encode()
    s = socket.create_connection((server.host, server.port), timeout=30)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {server.api_key}\r\nContent-Length: {len(payload)}\r\n\r\n")
    s.sendall(head.encode() + payload)
    return s


def wait_for(pred, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_64_concurrent_streams(client, model, server):
    def one(i):
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"stream {i}"}],
            max_tokens=STREAM_TOKENS,
            temperature=0, stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens > 0
        return "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        texts = list(pool.map(one, range(64)))
    assert len(texts) == 64 and all(isinstance(t, str) for t in texts)
    assert wait_for(lambda: server.metric("moeserve:num_requests_running") == 0)


def test_disconnect_aborts_and_frees_kv(server, model):
    before = server.metric("moeserve:request_success_total", 'finished_reason="abort"')
    socks = []
    for i in range(4):
        s = raw_stream_request(server, {"model": model, "prompt": f"long {i}", "max_tokens": 1500,
                                        "stream": True, "ignore_eos": True})
        socks.append(s)
    for s in socks:
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    assert wait_for(lambda: server.metric("moeserve:num_requests_running") >= 4)
    assert server.metric("moeserve:kv_cache_usage_perc") > 0
    for s in socks:
        s.close()
    assert wait_for(lambda: server.metric("moeserve:num_requests_running") == 0)
    assert wait_for(lambda: server.metric("moeserve:kv_cache_usage_perc") == 0)
    assert server.metric("moeserve:request_success_total", 'finished_reason="abort"') >= before + 4
    m = server.metrics()
    free = [v for k, v in m.items() if k.startswith("moeserve:kv_cache_blocks_free")]
    total = [v for k, v in m.items() if k.startswith("moeserve:kv_cache_blocks_total")]
    assert free == total


def test_disconnect_non_streaming(server, model):
    s = raw_stream_request(server, {"model": model, "prompt": "long", "max_tokens": 1500,
                                    "ignore_eos": True})
    assert wait_for(lambda: server.metric("moeserve:num_requests_running") >= 1)
    s.close()
    assert wait_for(lambda: server.metric("moeserve:num_requests_running") == 0)


def test_sigterm_drains_in_flight():
    srv = Server(api_key=None)
    try:
        s = raw_stream_request(srv, {"prompt": "drain", "max_tokens": 40, "stream": True,
                                     "ignore_eos": True})
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        srv.proc.send_signal(signal.SIGTERM)
        data = b""
        s.settimeout(30)
        while not data.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        assert b"data: [DONE]" in data, "the in-flight stream finishes"
        assert srv.proc.wait(timeout=30) == 0
    finally:
        srv.stop()


def test_sigterm_aborts_after_drain_timeout():
    srv = Server(api_key=None, args=["--drain-timeout", "0.5"])
    try:
        s = raw_stream_request(srv, {"prompt": "drain", "max_tokens": 1800, "stream": True,
                                     "ignore_eos": True})
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        t0 = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 10
    finally:
        srv.stop()
