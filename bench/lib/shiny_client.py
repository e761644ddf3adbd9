"""Plays one Shiny session the way a browser does, from a small JSON script
(see bench/apps/whales/session.json): GET the page and the assets it names
(up to 6 connections at once, keep-alive, the cookies the server sets), open
the WebSocket at `websocket/` beside the page (shiny's own path when no
SockJS is in front), send `init` with the inputs and the client data a
browser sends (each output's size and whether it is hidden), wait until every
output the script expects has arrived, then play each step: think, change
inputs (a tab change also reports which outputs it shows and hides), wait for
the outputs it expects.

Every phase is recorded with its start and end on one clock (time.monotonic),
for the timeline and the table. Uses `websockets` (python3-websockets), the
maintained asyncio WebSocket client, and a small HTTP/1.1 client of its own
(the standard library has no asyncio one).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

import websockets

# What a browser sends for a plot (shiny 1.7.4 asks each output for its colours and font).
PLOT_STYLE = {
    "bg": "rgb(255, 255, 255)",
    "fg": "rgb(51, 51, 51)",
    "accent": "rgb(51, 122, 183)",
    "font": {"families": ["Helvetica Neue", "Helvetica", "Arial", "sans-serif"], "size": "14px"},
}
BROWSER_CONNECTIONS = 6


@dataclass
class Phase:
    kind: str  # "page", "output" (connect + init, or a step), "think"
    start: float
    end: float
    ok: bool = True
    label: str = ""


@dataclass
class SessionResult:
    index: int
    phases: list[Phase] = field(default_factory=list)
    error: str | None = None

    def page_load(self) -> float | None:
        p = [x for x in self.phases if x.kind == "page" and x.ok]
        return p[0].end - p[0].start if p else None

    def output_waits(self) -> list[float]:
        return [x.end - x.start for x in self.phases if x.kind == "output" and x.ok]


class HttpError(Exception):
    pass


class Browser:
    """The HTTP side of one browser: a cookie jar and up to 6 keep-alive connections."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self.cookies: dict[str, str] = {}
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(BROWSER_CONNECTIONS)

    def cookie_header(self) -> str:
        return "; ".join(f"{k}={v}" for k, v in self.cookies.items())

    async def get(self, path: str) -> tuple[int, bytes]:
        async with self.slots:
            conn = self.idle.pop() if self.idle else None
            for attempt in range(2):
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout)
                try:
                    status, body, keep = await asyncio.wait_for(self._exchange(conn, path), self.timeout)
                except (ConnectionError, asyncio.IncompleteReadError) as e:
                    conn[1].close()
                    conn = None
                    # A kept-alive connection the server had closed: once more on a fresh one.
                    if attempt == 0:
                        continue
                    raise HttpError(f"GET {path}: {e}") from e
                except asyncio.TimeoutError:
                    conn[1].close()
                    raise HttpError(f"GET {path}: no answer within {self.timeout:.0f}s")
                if keep:
                    self.idle.append(conn)
                else:
                    conn[1].close()
                return status, body
        raise HttpError(f"GET {path}: failed")

    async def _exchange(self, conn, path: str) -> tuple[int, bytes, bool]:
        reader, writer = conn
        head = [f"GET {path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                "User-Agent: valve-shiny-load", "Accept: */*"]
        if self.cookies:
            head.append(f"Cookie: {self.cookie_header()}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("connection closed")
        m = re.match(rb"HTTP/1\.[01] (\d{3})", status_line)
        if not m:
            raise ConnectionError(f"bad status line {status_line!r}")
        status = int(m.group(1))
        headers: list[tuple[str, str]] = []
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers.append((k.strip().lower(), v.strip()))
        for k, v in headers:
            if k == "set-cookie":
                name, _, rest = v.partition("=")
                self.cookies[name.strip()] = rest.split(";", 1)[0]
        h = dict(headers)
        keep = h.get("connection", "").lower() != "close"
        if h.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += await reader.readexactly(size)
                await reader.readexactly(2)
            return status, bytes(body), keep
        if "content-length" in h:
            return status, await reader.readexactly(int(h["content-length"])), keep
        return status, await reader.read(), False

    def close(self) -> None:
        for _, w in self.idle:
            w.close()
        self.idle.clear()


def assets_of(html: str) -> list[str]:
    """The scripts and stylesheets a page names (what a browser fetches before it runs shiny.js)."""
    found = re.findall(r'<script[^>]+src="([^"]+)"', html) + \
        re.findall(r'<link[^>]+href="([^"]+)"', html)
    out = []
    for a in found:
        if a.startswith(("http:", "https:", "//", "data:")):
            continue
        out.append(a if a.startswith("/") else "/" + a)
    return list(dict.fromkeys(out))


class Script:
    def __init__(self, spec: dict):
        self.spec = spec
        self.outputs: dict[str, dict] = spec["outputs"]
        self.tabs_input: str | None = spec.get("tabs_input")

    def visibility(self, tab: str | None, only_changed_from: str | None = None) -> dict:
        """Client data for every output given the current tab: hidden or not, and a
        plot's size once it is shown (as shiny.js reports them)."""
        data = {}
        for name, o in self.outputs.items():
            hidden = o.get("tab") is not None and o.get("tab") != tab
            was_hidden = o.get("tab") is not None and o.get("tab") != only_changed_from
            if only_changed_from is not None and hidden == was_hidden:
                continue
            if "plot" in o and not hidden:
                data[f".clientdata_output_{name}_width"], data[f".clientdata_output_{name}_height"] = o["plot"]
            data[f".clientdata_output_{name}_hidden"] = hidden
        return data

    def init_message(self, host: str, port: int) -> dict:
        data = dict(self.spec["init"])
        tab = data.get(self.tabs_input) if self.tabs_input else None
        for name, o in self.outputs.items():
            if "plot" in o:
                for k, v in PLOT_STYLE.items():
                    data[f".clientdata_output_{name}_{k}"] = v
        data.update(self.visibility(tab))
        data.update({
            ".clientdata_pixelratio": 1,
            ".clientdata_url_protocol": "http:",
            ".clientdata_url_hostname": host,
            ".clientdata_url_port": str(port),
            ".clientdata_url_pathname": self.spec.get("page", "/"),
            ".clientdata_url_search": "",
            ".clientdata_url_hash_initial": "",
            ".clientdata_url_hash": "",
            ".clientdata_singletons": "",
        })
        return {"method": "init", "data": data}


class Outputs:
    """Reads the server's messages; tells when the expected outputs have arrived."""

    def __init__(self, ws):
        self.ws = ws
        self.busy = "idle"
        self.arrived: set[str] = set()
        self.failed: set[str] = set()

    async def wait_for(self, expect: list[str], timeout: float) -> None:
        self.arrived.clear()
        self.failed.clear()
        deadline = time.monotonic() + timeout
        while not (set(expect) <= self.arrived | self.failed and self.busy == "idle"):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(expect) - self.arrived - self.failed)
                raise asyncio.TimeoutError(f"outputs {missing} not there after {timeout:.0f}s")
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), left))
            if "busy" in msg:
                self.busy = msg["busy"]
            self.arrived.update((msg.get("values") or {}).keys())
            self.failed.update((msg.get("errors") or {}).keys())
        if self.failed & set(expect):
            raise RuntimeError(f"outputs failed in R: {sorted(self.failed & set(expect))}")


async def play(index: int, script: Script, host: str, port: int, timeout: float,
               think_scale: float = 1.0) -> SessionResult:
    """One visitor, start to end. Never raises: a failure ends the session and is recorded."""
    res = SessionResult(index)
    browser = Browser(host, port, timeout)
    page = script.spec.get("page", "/")
    t = time.monotonic()
    try:
        status, body = await browser.get(page)
        if status != 200:
            raise HttpError(f"GET {page}: status {status}")
        assets = assets_of(body.decode("utf-8", "replace"))
        answers = await asyncio.gather(*(browser.get(a) for a in assets))
        bad = [a for a, (s, _) in zip(assets, answers) if s != 200]
        if bad:
            raise HttpError(f"assets answered non-200: {bad[:3]}")
        res.phases.append(Phase("page", t, time.monotonic(), label=f"{1 + len(assets)} requests"))

        t = time.monotonic()
        base = page if page.endswith("/") else page.rsplit("/", 1)[0] + "/"
        headers = {"Cookie": browser.cookie_header()} if browser.cookies else {}
        async with websockets.connect(f"ws://{host}:{port}{base}websocket/", extra_headers=headers,
                                      max_size=None, compression=None, open_timeout=timeout,
                                      ping_interval=None) as ws:
            outputs = Outputs(ws)
            await ws.send(json.dumps(script.init_message(host, port)))
            await outputs.wait_for(script.spec.get("expect", []), timeout)
            res.phases.append(Phase("output", t, time.monotonic(), label="init"))
            tab = script.spec["init"].get(script.tabs_input) if script.tabs_input else None
            for i, step in enumerate(script.spec.get("steps", [])):
                t = time.monotonic()
                await asyncio.sleep(step.get("think", 0) * think_scale)
                res.phases.append(Phase("think", t, time.monotonic()))
                data = dict(step["set"])
                if script.tabs_input and script.tabs_input in data:
                    data.update(script.visibility(data[script.tabs_input], only_changed_from=tab))
                    tab = data[script.tabs_input]
                t = time.monotonic()
                await ws.send(json.dumps({"method": "update", "data": data}))
                await outputs.wait_for(step.get("expect", []), timeout)
                res.phases.append(Phase("output", t, time.monotonic(), label=f"step {i + 1}"))
    except (Exception, asyncio.TimeoutError) as e:  # noqa: BLE001 - every failure is recorded
        kind = "page" if not res.phases else "output"
        res.phases.append(Phase(kind, t, time.monotonic(), ok=False, label=type(e).__name__))
        res.error = f"{type(e).__name__}: {e}"
    finally:
        browser.close()
    return res


async def play_all(script: Script, host: str, port: int, sessions: int, every: float,
                   timeout: float, think_scale: float = 1.0) -> tuple[float, list[SessionResult]]:
    """`sessions` visitors, one every `every` seconds; returns the start time and the results."""
    t0 = time.monotonic()

    async def one(i: int) -> SessionResult:
        await asyncio.sleep(max(0.0, t0 + i * every - time.monotonic()))
        return await play(i, script, host, port, timeout, think_scale)

    results = await asyncio.gather(*(one(i) for i in range(sessions)))
    return t0, list(results)
