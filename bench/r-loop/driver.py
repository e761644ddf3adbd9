"""valve's side of the frame protocol (PROTOCOL.md), in Python, for measuring
and testing src/worker/loop.R. It is a model of what the Rust side does:
listen on loopback, accept a worker's connection, check its hello, send request
frames, read answer frames, and turn an answer into the HTTP/1.1 bytes httpuv
1.6.9 would have written.

Nothing here is used by valve itself.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOP_R = HERE.parent.parent / "src" / "worker" / "loop.R"  # embedded in valve; measured here

# Frame types (byte 0 of the 16-byte frame header).
REQUEST, PING = ord("Q"), ord("P")
HELLO, ANSWER, PONG = ord("H"), ord("A"), ord("O")
# REQUEST flags
REQ_BODY_FILE = 1
# ANSWER flags
ANS_BODY_FILE, ANS_FILE_OWNED, ANS_NO_BODY, ANS_LOOP_ERROR = 1, 2, 4, 8
PROTOCOL = b"valve-frames/2"

HEADER = struct.Struct(">BBxxIQ")  # type, flags, 2 reserved, head length, body length

TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)


class ProtocolError(Exception):
    pass


# --------------------------------------------------------------------------
# Requests


@dataclass
class Request:
    method: str = "GET"
    target: str = "/"  # the request-target as received: path and query
    headers: list[tuple[str, str]] = field(default_factory=list)  # as received, in order, repeats kept
    body: bytes = b""
    body_file: str | None = None  # a spooled body: the path (the file holds the body)
    server_name: str = "127.0.0.1"
    server_port: str = "0"
    remote_addr: str = "127.0.0.1"
    remote_port: str = "0"
    url_scheme: str = "http"

    def split_target(self) -> tuple[str, str]:
        """httpuv: PATH_INFO is the target up to the first '?', QUERY_STRING the rest
        *with* its '?' (or empty)."""
        i = self.target.find("?")
        return (self.target, "") if i < 0 else (self.target[:i], self.target[i:])


def merge_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """httpuv 1.6.9's header map: names compared case-insensitively; a repeat
    joins its value to a non-empty earlier one with ',' (an empty repeat is
    dropped; a value after an empty one replaces it); the result is ordered by
    name, case-insensitively. Returned with lower-case names."""
    merged: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key in merged and merged[key]:
            if value:
                merged[key] = merged[key] + "," + value
        else:
            merged[key] = value
    return sorted(merged.items(), key=lambda kv: kv[0].encode("latin-1"))


def http_key(name: str) -> str:
    """httpuv's environment name for a header: HTTP_ + ASCII upper case, '-' -> '_'."""
    return "HTTP_" + name.upper().replace("-", "_")


def fields(req: Request) -> list[bytes]:
    """The request head's fields, in protocol order (PROTOCOL.md): the number of
    headers n, 8 fixed fields, n HTTP_* keys, n lower-case names, n values."""
    path, query = req.split_target()
    merged = merge_headers(req.headers)
    out = [str(len(merged)), req.method, path, query, req.server_name, req.server_port, req.remote_addr,
           req.remote_port, req.url_scheme]
    out += [http_key(n) for n, _ in merged] + [n for n, _ in merged] + [v for _, v in merged]
    raw = [s.encode("latin-1") for s in out]
    for f in raw:
        if b"\n" in f or b"\0" in f:
            raise ProtocolError(f"a field holds a newline or NUL: {f!r}")
    return raw


def encode_text(req: Request) -> bytes:
    return b"".join(f + b"\n" for f in fields(req))


def encode_lp(req: Request) -> bytes:
    f = fields(req)
    return struct.pack(f">I{len(f)}I", len(f), *map(len, f)) + b"".join(f)


# R serialization, XDR, format version 2 (PROTOCOL.md, "request head") -----
#
# The writer valve needs is this small on purpose: every integer is an int32,
# big-endian; every string is a CHARSXP with flags 9 (no encoding bits: R reads
# it as native and works out ASCII itself); every symbol is written in full
# (SYMSXP + its name), never as a reference, so no reference table is kept.

SERIAL_HEADER = b"X\n" + struct.pack(">iii", 2, 0x00040202, 0x00020300)  # XDR, v2, written by "4.2.2", readable by 2.3.0+
NILVALUE, EMPTYENV = 254, 242
SYMSXP, LISTSXP, ENVSXP, CHARSXP, STRSXP, VECSXP = 1, 2, 4, 9, 16, 19
HAS_ATTR, HAS_TAG = 1 << 9, 1 << 10


class _RWriter:
    def __init__(self):
        self.out = [SERIAL_HEADER]

    def i(self, *xs: int) -> None:
        self.out.append(struct.pack(f">{len(xs)}i", *xs))

    def charsxp(self, b: bytes) -> None:
        self.i(CHARSXP, len(b))
        self.out.append(b)

    def symbol(self, name: bytes) -> None:
        self.i(SYMSXP)
        self.charsxp(name)

    def strsxp(self, values: list[bytes], names: list[bytes] | None = None) -> None:
        self.i(STRSXP | (HAS_ATTR if names is not None else 0), len(values))
        for v in values:
            self.charsxp(v)
        if names is not None:
            self.attrib_names(names)

    def attrib_names(self, names: list[bytes]) -> None:
        self.i(LISTSXP | HAS_TAG)
        self.symbol(b"names")
        self.strsxp(names)
        self.i(NILVALUE)

    def bytes(self) -> bytes:
        return b"".join(self.out)


FIXED_KEYS = [b"REQUEST_METHOD", b"PATH_INFO", b"QUERY_STRING", b"SERVER_NAME", b"SERVER_PORT", b"REMOTE_ADDR",
              b"REMOTE_PORT", b"rook.url_scheme"]


def _rds_vars(req: Request) -> tuple[list[tuple[bytes, bytes]], list[bytes], list[bytes]]:
    """The environment's string variables (in order, each name once) and
    HEADERS' names and values. Two header names that differ only by '-' and
    '_' map to one HTTP_* key: the later one in name order wins, as when httpuv
    assigns them in its map's order."""
    f = fields(req)
    n = int(f[0])
    pairs = dict(zip(FIXED_KEYS, f[1:9]))
    pairs[b"SCRIPT_NAME"] = b""
    pairs[b"rook.version"] = b"1.1-0"
    hk, hn, hv = f[9:9 + n], f[9 + n:9 + 2 * n], f[9 + 2 * n:]
    for k, v in zip(hk, hv):
        pairs[k] = v
    return list(pairs.items()), hn, hv


def encode_rds(req: Request) -> bytes:
    """A named list of every string variable, plus HEADERS (a named character vector)."""
    pairs, hn, hv = _rds_vars(req)
    w = _RWriter()
    w.i(VECSXP | HAS_ATTR, len(pairs) + 1)
    for _, v in pairs:
        w.strsxp([v])
    w.strsxp(hv, hn)
    w.attrib_names([k for k, _ in pairs] + [b"HEADERS"])
    return w.bytes()


def encode_rdsenv(req: Request) -> bytes:
    """The protocol's request head: the environment itself. ENVSXP, not
    locked, enclosed by the empty environment, its frame a pairlist of
    bindings (each value a character vector of length 1, HEADERS a named
    character vector), no hash table, no attributes."""
    pairs, hn, hv = _rds_vars(req)
    w = _RWriter()
    w.i(ENVSXP, 0, EMPTYENV)  # type, locked = 0, enclosure
    for k, v in pairs:
        w.i(LISTSXP | HAS_TAG)
        w.symbol(k)
        w.strsxp([v])
    w.i(LISTSXP | HAS_TAG)
    w.symbol(b"HEADERS")
    w.strsxp(hv, hn)
    w.i(NILVALUE, NILVALUE, NILVALUE)  # end of the frame, hash table, attributes
    return w.bytes()


ENCODERS = {"text": encode_text, "lp": encode_lp, "rds": encode_rds, "rdsenv": encode_rdsenv}


def request_frame(req: Request, encoding: str = "rdsenv") -> bytes:
    head = ENCODERS[encoding](req)
    if req.body_file is not None:
        body, flags = req.body_file.encode(), REQ_BODY_FILE
    else:
        body, flags = req.body, 0
    return HEADER.pack(REQUEST, flags, len(head), len(body)) + head + body


# --------------------------------------------------------------------------
# Answers


@dataclass
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes  # the bytes, or the file path when flags & ANS_BODY_FILE
    flags: int

    @property
    def no_body(self) -> bool:
        return bool(self.flags & ANS_NO_BODY)

    @property
    def body_file(self) -> str | None:
        return self.body.decode() if self.flags & ANS_BODY_FILE else None

    def body_bytes(self) -> bytes | None:
        """The body to send: None without one; a file's contents (deleted if owned)."""
        if self.no_body:
            return None
        if self.flags & ANS_BODY_FILE:
            path = self.body_file
            data = Path(path).read_bytes()
            if self.flags & ANS_FILE_OWNED:
                os.unlink(path)
            return data
        return self.body


def parse_answer(flags: int, head: bytes, body: bytes) -> Answer:
    status, n = struct.unpack_from(">iI", head, 0)
    lens = struct.unpack_from(f">{2 * n}I", head, 8)
    pos = 8 + 8 * n
    headers = []
    for k in range(n):
        name = head[pos:pos + lens[2 * k]]
        pos += lens[2 * k]
        value = head[pos:pos + lens[2 * k + 1]]
        pos += lens[2 * k + 1]
        headers.append((name, value))
    if pos != len(head):
        raise ProtocolError(f"answer head has {len(head) - pos} stray bytes")
    return Answer(status, headers, body, flags)


STATUS_TEXT = {
    100: "Continue", 101: "Switching Protocols", 200: "OK", 201: "Created", 202: "Accepted",
    203: "Non-Authoritative Information", 204: "No Content", 205: "Reset Content", 206: "Partial Content",
    300: "Multiple Choices", 301: "Moved Permanently", 302: "Found", 303: "See Other", 304: "Not Modified",
    305: "Use Proxy", 307: "Temporary Redirect", 400: "Bad Request", 401: "Unauthorized",
    402: "Payment Required", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
    406: "Not Acceptable", 407: "Proxy Authentication Required", 408: "Request Timeout", 409: "Conflict",
    410: "Gone", 411: "Length Required", 412: "Precondition Failed", 413: "Request Entity Too Large",
    414: "Request-URI Too Long", 415: "Unsupported Media Type", 416: "Requested Range Not Satisifable",
    417: "Expectation Failed", 500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported",
}


def render_http(ans: Answer, req: Request, date: str | None = None) -> bytes:
    """The HTTP/1.1 answer httpuv 1.6.9 writes for the same list (HttpResponse::
    writeResponse): status line with httpuv's reason phrases ("Dunno" for the
    rest), Date first, the app's headers in order except Content-Length, then
    Content-Encoding: gzip + chunked when the request accepts gzip and the app set
    no Content-Encoding, else Content-Length (the app's, or the body's size; none
    when there is no body)."""
    body = ans.body_bytes()
    lines = [f"HTTP/1.1 {ans.status} {STATUS_TEXT.get(ans.status, 'Dunno')}".encode(),
             b"Date: " + (date or formatdate(usegmt=True)).encode()]
    app_length = None
    encoded = False
    for name, value in ans.headers:
        if name.lower() == b"content-length":
            app_length = value
            continue
        lines.append(name + b": " + value)
        if name.lower() == b"content-encoding":
            encoded = True
    accept = next((v for n, v in merge_headers(req.headers) if n == "accept-encoding"), "")
    gzip = not encoded and ans.status != 101 and body is not None and "gzip" in accept
    out_body = body or b""
    if gzip:
        lines.append(b"Content-Encoding: gzip")
        lines.append(b"Transfer-Encoding: chunked")
        c = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 31)
        z = c.compress(out_body) + c.flush()
        out_body = (b"%x\r\n" % len(z) + z + b"\r\n" if z else b"") + b"0\r\n\r\n"
    elif ans.status == 101:
        pass
    elif app_length is not None:
        lines.append(b"Content-Length: " + app_length)
    elif body is not None:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + out_body


# --------------------------------------------------------------------------
# The connection


def recv_exact(sock: socket.socket, n: int, quickack: bool = False) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if quickack:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError(f"worker closed the connection ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket, quickack: bool = True) -> tuple[int, int, bytes, bytes]:
    t, flags, hl, bl = HEADER.unpack(recv_exact(sock, HEADER.size, quickack))
    head = recv_exact(sock, hl, quickack)
    body = recv_exact(sock, bl, quickack)
    return t, flags, head, body


class Worker:
    """One worker's connection, after its hello."""

    def __init__(self, sock: socket.socket, worker_id: str, pid: int, encoding: str = "rdsenv",
                 quickack: bool = True):
        self.sock, self.id, self.pid, self.encoding, self.quickack = sock, worker_id, pid, encoding, quickack

    def exchange(self, req: Request) -> Answer:
        self.sock.sendall(request_frame(req, self.encoding))
        t, flags, head, body = read_frame(self.sock, self.quickack)
        if t != ANSWER:
            raise ProtocolError(f"expected an answer frame, got type {t}")
        return parse_answer(flags, head, body)

    def send_raw(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def ping(self) -> int:
        nonce = secrets.token_bytes(8)
        self.sock.sendall(HEADER.pack(PING, 0, 8, 0) + nonce)
        t, _, head, _ = read_frame(self.sock, self.quickack)
        if t != PONG or head[:8] != nonce:
            raise ProtocolError("bad pong")
        return struct.unpack(">i", head[8:12])[0]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Listener:
    """valve's loopback listener for worker connections."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.token = secrets.token_hex(32)

    def env(self, worker_id: str) -> dict[str, str]:
        return {"VALVE_FRAME_PORT": str(self.port), "VALVE_FRAME_TOKEN": self.token, "VALVE_WORKER_ID": worker_id}

    def accept(self, expect_id: str | set[str], timeout: float, encoding: str = "rdsenv", alive=lambda: True,
               quickack: bool = True) -> Worker:
        """The next worker that connects with a valid hello and one of the
        expected ids; connections that fail the hello are closed, as valve does."""
        expected = {expect_id} if isinstance(expect_id, str) else set(expect_id)
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(0.2)
            try:
                conn, addr = self.sock.accept()
            except socket.timeout:
                if not alive():
                    raise ProtocolError("the worker exited before connecting")
                if time.monotonic() > deadline:
                    raise ProtocolError(f"no worker connected within {timeout:.0f}s")
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(10)
            try:
                t, _, head, _ = read_frame(conn)
                lines = head.split(b"\n")
                if t != HELLO or len(lines) != 5 or lines[0] != PROTOCOL or lines[4] != b"":
                    raise ProtocolError("not a hello")
                if not hmac.compare_digest(lines[3], self.token.encode()):
                    raise ProtocolError("wrong token")
                if lines[1].decode() not in expected:
                    raise ProtocolError(f"unexpected worker id {lines[1]!r}")
            except (ProtocolError, EOFError, OSError) as e:
                conn.close()
                if time.monotonic() > deadline:
                    raise ProtocolError(f"no valid hello: {e}")
                continue
            conn.settimeout(None)
            return Worker(conn, lines[1].decode(), int(lines[2]), encoding, quickack)

    def close(self) -> None:
        self.sock.close()


# An R script that serves an API on frames the way the launcher would: plumber's
# run() with httpuv::runServer swapped for valve_serve_frames. With api "-" it
# serves a trivial app instead (no plumber): the loop's own cost per request.
SERVE_FRAMES_R = r"""
args <- commandArgs(TRUE)  # api loop.R encoding warm_up
source(args[2])
source(file.path(dirname(dirname(dirname(normalizePath(args[2])))), "bench", "r-loop", "decoders.R"))
serve <- function(app, warm_up = as.logical(args[4])) {
  valve_serve_frames(app, port = as.integer(Sys.getenv("VALVE_FRAME_PORT")),
                     token = Sys.getenv("VALVE_FRAME_TOKEN"), worker_id = Sys.getenv("VALVE_WORKER_ID"),
                     encoding = args[3], warm_up = warm_up)
}
if (args[1] == "-") {
  serve(list(call = function(req) list(status = 200L, headers = list("Content-Type" = "text/plain"), body = "ok")))
} else {
  suppressPackageStartupMessages(library(plumber))
  pr <- plumb(args[1])
  utils::assignInNamespace("runServer", function(host, port, app, interruptIntervalMs = NULL) serve(app),
                           ns = "httpuv")
  pr$run(quiet = TRUE)
}
quit(save = "no", status = 0)
"""
