"""Fixtures for the server tests: a live `moeserve serve` on 127.0.0.1 and a free port.

MOESERVE_SERVER_IMPL picks what is served (default: real):
  real  `$MOESERVE_BIN serve` (the embedded tiny model, random weights: tests assert only
        model-agnostic properties on it)
  fake  `$MOESERVE_FAKE_SERVE_BIN` (the same HTTP server around tests/server's scripted engine)
  toy   `$MOESERVE_FAKE_SERVE_BIN --engine toy` (the real EngineCore, KV manager, sampler,
        tokenizer and chat encoding, driving a toy forward model)
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

API_KEY = "sk-moeserve-test"


def impl() -> str:
    return os.environ.get("MOESERVE_SERVER_IMPL", "real")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args=(), api_key=API_KEY, max_model_len=2048, env=None):
        self.port = free_port()
        self.host = "127.0.0.1"
        self.api_key = api_key
        self.max_model_len = max_model_len
        if impl() == "fake":
            cmd = [os.environ["MOESERVE_FAKE_SERVE_BIN"], "--fake-step-ms", "2"]
        elif impl() == "toy":
            cmd = [os.environ["MOESERVE_FAKE_SERVE_BIN"], "--engine", "toy"]
        else:
            cmd = [os.environ.get("MOESERVE_BIN", "build/cpu-debug/bin/moeserve"), "serve"]
        cmd += ["--host", self.host, "--port", str(self.port), "--max-model-len",
                str(max_model_len)]
        if api_key:
            cmd += ["--api-key", api_key]
        cmd += list(args)
        self.log_path = f"/tmp/moeserve_server_test_{self.port}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: "
                                   + open(self.log_path).read()[-3000:])
            try:
                status, _, _ = self.request("GET", "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not become healthy")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=30, auth=True):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            h = dict(headers or {})
            if auth and self.api_key and "Authorization" not in h:
                h["Authorization"] = f"Bearer {self.api_key}"
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                h.setdefault("Content-Type", "application/json")
            elif isinstance(body, str):
                body = body.encode()
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, dict(resp.getheaders()), data
        finally:
            conn.close()

    def json(self, method, path, body=None, **kw):
        status, headers, data = self.request(method, path, body, **kw)
        return status, json.loads(data) if data else None

    def metrics(self) -> dict:
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
        return out

    def metric(self, name: str, labels: str = "") -> float:
        m = self.metrics()
        for key, value in m.items():
            base = key.split("{")[0]
            if base == name and labels in key:
                return value
        raise KeyError(name)

    def stop(self, sig=signal.SIGTERM, timeout=30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    rc = s.stop()
    assert rc == 0, open(s.log_path).read()[-3000:]


@pytest.fixture(scope="session")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key,
                         max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def model(client):
    return client.models.list().data[0].id


fake_only = pytest.mark.skipif(impl() != "fake",
                               reason="scripted output needs the fake engine")


real_only = pytest.mark.skipif(impl() != "real",
                               reason="needs the real engine service (DeepSeek-V4 chat encoding)")
