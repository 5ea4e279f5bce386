#!/usr/bin/env python3
"""Loopback load test for `moeserve serve`: hold N concurrent streaming connections.

Opens --connections raw asyncio sockets (no HTTP library: the client must be cheaper than the
server), sends one streaming /v1/completions request on each, reads every SSE event to
`data: [DONE]`, and reports errors, tokens, wall time, and the server's CPU time (utime+stime from
/proc/<pid>/stat) per streamed token. Bounded: --timeout caps the whole run.

  python3 tools/server_load.py --port 8000 --server-pid PID --connections 2000 --max-tokens 64
"""
import argparse
import asyncio
import json
import os
import resource
import sys
import time


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, need + 256))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def thread_cpu_seconds(pid: int) -> dict:
    """utime+stime of every thread of the process, by thread id."""
    out = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
        except OSError:
            pass
    return out


class Stats:
    def __init__(self):
        self.ok = 0
        self.errors = {}
        self.tokens = 0
        self.events = 0
        self.first_event = []
        self.open_now = 0
        self.max_open = 0

    def error(self, kind: str):
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def one(args, stats: Stats, idx: int, started: asyncio.Event, all_open: asyncio.Event):
    body = json.dumps({"model": args.model, "prompt": f"load test {idx}",
                       "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {args.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
    if args.api_key:
        head += f"Authorization: Bearer {args.api_key}\r\n"
    head += "\r\n"
    try:
        reader, writer = await asyncio.open_connection(args.host, args.port, limit=1 << 20)
    except OSError as e:
        stats.error(f"connect:{e.errno}")
        return
    stats.open_now += 1
    stats.max_open = max(stats.max_open, stats.open_now)
    try:
        if args.hold:
            await all_open.wait()
        t0 = time.perf_counter()
        writer.write(head.encode() + body)
        await writer.drain()
        status = await reader.readline()
        if not status.startswith(b"HTTP/1.1 200"):
            stats.error(f"status:{status[:12].decode(errors='replace').strip()}")
            return
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        buf = b""
        done = False
        usage_tokens = None
        first = True
        while not done:
            size_line = await reader.readline()
            if not size_line:
                stats.error("eof")
                return
            size = int(size_line.strip(), 16)
            if size == 0:
                await reader.readline()
                break
            buf += await reader.readexactly(size)
            await reader.readexactly(2)
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: "):
                    stats.error("framing")
                    return
                payload = ev[6:]
                stats.events += 1
                if first:
                    stats.first_event.append(time.perf_counter() - t0)
                    first = False
                if payload == b"[DONE]":
                    done = True
                    break
                j = json.loads(payload)
                if "error" in j:
                    stats.error("error_event")
                    return
                if j.get("usage"):
                    usage_tokens = j["usage"]["completion_tokens"]
        if usage_tokens != args.max_tokens:
            stats.error("usage")
            return
        stats.tokens += usage_tokens
        stats.ok += 1
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        stats.error(type(e).__name__)
    finally:
        stats.open_now -= 1
        writer.close()


async def poll_metrics(args, peaks: dict, stop: asyncio.Event):
    """Samples the server's active-stream and running-request gauges."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(args.host, args.port)
            writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                         .encode())
            data = await reader.read()
            writer.close()
            for line in data.decode(errors="replace").splitlines():
                for name in ("moeserve:http_streams_active", "moeserve:num_requests_running"):
                    if line.startswith(name + "{"):
                        v = float(line.rsplit(" ", 1)[1])
                        peaks[name] = max(peaks.get(name, 0), v)
        except OSError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.25)
        except asyncio.TimeoutError:
            pass


async def main_async(args):
    stats = Stats()
    peaks = {}
    stop_poll = asyncio.Event()
    poller = asyncio.create_task(poll_metrics(args, peaks, stop_poll))
    all_open = asyncio.Event()
    started = asyncio.Event()
    tasks = []
    cpu0 = cpu_seconds(args.server_pid) if args.server_pid else None
    threads0 = thread_cpu_seconds(args.server_pid) if args.server_pid else {}
    t0 = time.perf_counter()
    for i in range(args.connections):
        tasks.append(asyncio.create_task(one(args, stats, i, started, all_open)))
        if i % 200 == 199:
            await asyncio.sleep(0.05)  # do not overflow the listen backlog
    while args.hold and stats.max_open + sum(stats.errors.values()) < args.connections:
        await asyncio.sleep(0.05)
    held = stats.open_now
    all_open.set()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=args.timeout)
    except asyncio.TimeoutError:
        stats.error("timeout")
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(args.server_pid) - cpu0 if args.server_pid else None
    threads = {}
    if args.server_pid:
        for tid, v in thread_cpu_seconds(args.server_pid).items():
            threads[tid] = round(v - threads0.get(tid, 0.0), 3)
    stop_poll.set()
    await poller
    fe = sorted(stats.first_event)
    result = {
        "connections": args.connections, "held_open_at_once": held, "max_open": stats.max_open,
        "server_peak_active_streams": peaks.get("moeserve:http_streams_active"),
        "server_peak_running_requests": peaks.get("moeserve:num_requests_running"),
        "completed": stats.ok, "errors": stats.errors, "tokens": stats.tokens,
        "sse_events": stats.events, "wall_s": round(wall, 3),
        "tokens_per_s": round(stats.tokens / wall, 1) if wall > 0 else None,
        "first_event_p50_s": round(fe[len(fe) // 2], 4) if fe else None,
        "first_event_p99_s": round(fe[int(len(fe) * 0.99)], 4) if fe else None,
        "server_cpu_s": round(cpu, 3) if cpu is not None else None,
        "server_cpu_us_per_token": round(cpu / stats.tokens * 1e6, 2)
        if cpu is not None and stats.tokens else None,
        # Per-thread CPU seconds over the run (tid order: main, then the threads it started; in
        # `moeserve serve` the engine loop thread starts before the HTTP I/O threads).
        "server_cpu_s_by_thread": dict(sorted(threads.items())),
    }
    print(json.dumps(result, indent=2))
    return 0 if stats.ok == args.connections else 1


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("MOESERVE_API_KEY", ""))
    p.add_argument("--model", default=None)
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--hold", action="store_true",
                   help="open every connection before any request is sent")
    p.add_argument("--server-pid", type=int, default=0, help="measure this process's CPU time")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    raise_fd_limit(args.connections)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
