"""Fixtures for the `moeserve bench serve` tests: live loopback servers and a runner.

MOESERVE_BIN              the moeserve binary (default build/bench/bin/moeserve)
MOESERVE_FAKE_SERVE_BIN   tests/server's moeserve_fake_serve (the real HTTP server, scripted engine)
MOESERVE_BENCH_REAL=0     skip the tests against the real `moeserve serve` (embedded tiny model;
                          they run by default)
MOESERVE_CACHE_DIR        where `moeserve serve` generates the embedded model (CTest: the build tree)
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def moeserve_bin():
    return os.environ.get("MOESERVE_BIN", os.path.join(ROOT, "build/bench/bin/moeserve"))


def fake_bin():
    return os.environ.get("MOESERVE_FAKE_SERVE_BIN",
                          os.path.join(ROOT, "build/bench/bin/moeserve_fake_serve"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, cmd, port, timeout=120):
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = f"/tmp/moeserve_bench_serve_{port}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {open(self.log_path).read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not become healthy")

    def metrics(self):
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def fake_server():
    port = free_port()
    srv = LiveServer([fake_bin(), "--host", "127.0.0.1", "--port", str(port), "--fake-step-ms",
                      "1", "--max-model-len", "65536", "--log-level", "warn"], port)
    yield srv
    srv.stop()


def prom(text, name):
    """Sum of a Prometheus metric's samples (any labels) in /metrics text; None if absent."""
    total = None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total


def run_bench(args, out_json=None, timeout=300, check=None):
    """Runs `moeserve bench ...`; returns (returncode, stdout, parsed JSON or None)."""
    cmd = [moeserve_bin(), "--log-level", "warn", "bench"] + [str(a) for a in args]
    if out_json:
        cmd += ["-o", str(out_json)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(p.stdout[-4000:])
    sys.stderr.write(p.stderr[-4000:])
    if check is not None:
        assert p.returncode == check, p.stdout[-2000:] + p.stderr[-2000:]
    data = None
    if out_json and os.path.exists(out_json):
        with open(out_json) as f:
            data = json.load(f)
    return p.returncode, p.stdout, data


def ideal_cached(requests_in_order, block=64):
    """AgentX's idealised infinite cache: longest run of leading hash ids already seen."""
    seen = set()
    out = []
    for r in requests_in_order:
        n = 0
        ids = r["hash_ids"]
        while n < len(ids) and ids[n] in seen:
            n += 1
        seen.update(ids)
        out.append(min(n * block, r["input_len"]))
    return out


@pytest.fixture(scope="module")
def toy_server():
    """The real EngineCore (KV manager with a prefix cache, scheduler, sampler) around a toy forward
    model, behind the real HTTP server: reports real cached tokens."""
    port = free_port()
    try:
        srv = LiveServer([fake_bin(), "--engine", "toy", "--host", "127.0.0.1", "--port", str(port),
                          "--max-model-len", "8192", "--log-level", "warn"], port)
    except RuntimeError as e:
        pytest.skip(f"toy engine unavailable: {e}")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def real_server():
    """`moeserve serve` on the embedded tiny model (random weights, the real engine and prefix
    cache). MOESERVE_BENCH_REAL=0 skips the tests that use it."""
    if os.environ.get("MOESERVE_BENCH_REAL") == "0":
        pytest.skip("MOESERVE_BENCH_REAL=0")
    port = free_port()
    srv = LiveServer([moeserve_bin(), "--log-level", "warn", "serve", "--host", "127.0.0.1",
                      "--port", str(port), "--max-model-len", "2048"], port, timeout=300)
    yield srv
    srv.stop()
