"""Load clients written for what wrk cannot express.

- `closed_loop`: N threads, each sending requests one after another on a fresh
  TCP connection per request, for a fixed count: the reference tool's
  benchmark (ab-style).
- `many_keepalive`: asyncio; opens C keep-alive connections, holds all of
  them open, and sends requests on them at a modest fixed total rate.

Every loop is bounded by a request count and a deadline.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field

_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


@dataclass
class Sample:
    start: float  # seconds since the run began
    latency: float  # seconds
    status: int | None  # None: the request failed (connect, read, timeout)
    error: str = ""
    body: bytes = b""


@dataclass
class RunResult:
    samples: list[Sample] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ok(self) -> list[float]:
        return sorted(s.latency for s in self.samples if s.status == 200)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.samples if s.status != 200)


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Reads one whole response (Content-Length or close-delimited)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed before the response head")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    m = _STATUS.match(head)
    if not m:
        raise ConnectionError("not an HTTP response")
    status = int(m.group(1))
    cl = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if cl:
        want = int(cl.group(1))
        while len(body) < want:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed inside the body")
            body += chunk
    else:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return status, body


def one_fresh_request(port: int, request: bytes, timeout: float) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout)
        s.sendall(request)
        return _read_response(s)


def get_request(port: int, path: str, close: bool = True) -> bytes:
    conn = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: valve-bench\r\n{conn}\r\n".encode()


def closed_loop(port: int, path: str, requests: int, concurrency: int,
                timeout: float, deadline: float) -> RunResult:
    """`requests` GETs of `path`, `concurrency` at a time, each on a fresh connection."""
    req = get_request(port, path)
    lock = threading.Lock()
    counter = [0]
    res = RunResult()
    t0 = time.monotonic()
    stop_at = t0 + deadline

    def worker():
        while True:
            with lock:
                if counter[0] >= requests or time.monotonic() > stop_at:
                    return
                counter[0] += 1
            start = time.monotonic()
            body = b""
            try:
                status, body = one_fresh_request(port, req, timeout)
                err = ""
            except OSError as e:
                status, err = None, f"{type(e).__name__}: {e}"
            s = Sample(start - t0, time.monotonic() - start, status, err, body[:200])
            with lock:
                res.samples.append(s)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, stop_at + timeout + 5 - time.monotonic()))
    res.wall = time.monotonic() - t0
    return res


# --------------------------------------------------------------------------
# Many keep-alive connections


@dataclass
class ManyResult:
    samples: list[Sample]
    wall: float
    connected: int  # connections that were open at the same time before load began
    connect_failures: int
    dropped: int  # connections the server closed while the test ran


async def _read_response_async(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    m = _STATUS.match(head)
    if not m:
        raise ConnectionError("not an HTTP response")
    cl = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if not cl:
        raise ConnectionError("response without Content-Length on a keep-alive connection")
    await reader.readexactly(int(cl.group(1)))
    return int(m.group(1))


async def _many(port: int, path: str, connections: int, rate: float, duration: float,
                timeout: float, on_all_connected) -> ManyResult:
    req = get_request(port, path, close=False)
    sem = asyncio.Semaphore(100)  # connect in waves, not a SYN flood

    async def connect():
        async with sem:
            try:
                return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
            except (OSError, asyncio.TimeoutError):
                return None

    conns = await asyncio.gather(*(connect() for _ in range(connections)))
    live = [c for c in conns if c is not None]
    connect_failures = connections - len(live)
    if on_all_connected:
        on_all_connected()
    samples: list[Sample] = []
    dropped = 0
    interval = len(live) / rate if live else 1.0
    t0 = time.monotonic()
    end = t0 + duration

    async def client(reader, writer):
        nonlocal dropped
        # Spread the clients evenly over one interval so the total rate is steady.
        next_at = t0 + random.uniform(0, interval)
        while True:
            now = time.monotonic()
            if next_at >= end:
                break
            if next_at > now:
                await asyncio.sleep(next_at - now)
            start = time.monotonic()
            try:
                writer.write(req)
                status = await asyncio.wait_for(_read_response_async(reader), timeout)
                samples.append(Sample(start - t0, time.monotonic() - start, status))
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError) as e:
                samples.append(Sample(start - t0, time.monotonic() - start, None, type(e).__name__))
                dropped += 1
                break
            next_at += interval

    await asyncio.gather(*(client(r, w) for r, w in live))
    wall = time.monotonic() - t0
    for _, w in live:
        w.close()
    return ManyResult(samples, wall, len(live), connect_failures, dropped)


def many_keepalive(port: int, path: str, connections: int, rate: float, duration: float,
                   timeout: float = 10.0, on_all_connected=None) -> ManyResult:
    return asyncio.run(asyncio.wait_for(
        _many(port, path, connections, rate, duration, timeout, on_all_connected),
        duration + 4 * timeout + 60))
