"""The R workers bench/r-loop/measure and bench/r-loop/instructions drive:
plumber's router alone, plumber under httpuv as valve runs it today, and
plumber under the frame loop. Each starts its own R process through `launch`
(plain Rscript, or R under valgrind), warms up, and answers requests one at a
time (or `depth` in flight) for a number of seconds or a number of requests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lib"))

import driver as d  # noqa: E402
import harness as h  # noqa: E402


def rscript(script: Path, args: list[str]) -> list[str]:
    """The plain way to run an R script."""
    return ["Rscript", str(script), *args]


# The same request everywhere: bench/r-cost's.
HEADERS = [("Host", "127.0.0.1"), ("X-Forwarded-For", "127.0.0.1"), ("X-Forwarded-Proto", "http")]
HTTP_REQUEST = (b"GET /echo?msg=hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: 127.0.0.1\r\n"
                b"X-Forwarded-Proto: http\r\n\r\n")
EXPECT = b"{\"msg\":[\"The message is: 'hello'\"]}"

# The router's call() alone, on the request environment httpuv would build
# (bench/r-cost's ALONE_R), driven by commands on stdin: "N" runs N calls.
ALONE_R = r"""
args <- commandArgs(TRUE)  # api mode loop.R; mode "plain": plumb() only (bench/r-cost's way);
                           # "run": inside plumber's run(), as a worker is (docs mounted, loop.R loaded)
suppressPackageStartupMessages(library(plumber))
pr <- plumb(args[1])
input <- list(read = function(l = -1L) raw(0), read_lines = function() character(0),
              rewind = function() invisible(0L))
request <- function() {
  req <- new.env()
  req$REQUEST_METHOD <- "GET"; req$SCRIPT_NAME <- ""; req$PATH_INFO <- "/echo"
  req$QUERY_STRING <- "?msg=hello"; req$SERVER_NAME <- "127.0.0.1"; req$SERVER_PORT <- "0"
  req$HTTP_HOST <- "127.0.0.1"; req$HTTP_X_FORWARDED_FOR <- "127.0.0.1"; req$HTTP_X_FORWARDED_PROTO <- "http"
  req$HEADERS <- c(host = "127.0.0.1", "x-forwarded-for" = "127.0.0.1", "x-forwarded-proto" = "http")
  req$rook.version <- "1.1-0"; req$rook.url_scheme <- "http"; req$rook.input <- input
  req
}
serve_commands <- function() {
  commands <- file("stdin", open = "r")
  cat("ready\n"); flush(stdout())
  repeat {
    line <- readLines(commands, n = 1)
    if (length(line) == 0) break
    n <- as.integer(line)
    for (i in seq_len(n)) res <- pr$call(request())
    stopifnot(res$status == 200L)
    cat("done\n"); flush(stdout())
  }
}
if (args[2] == "run") {
  source(args[3])
  utils::assignInNamespace("runServer", function(host, port, app, interruptIntervalMs = NULL) serve_commands(),
                           ns = "httpuv")
  pr$run(quiet = TRUE)
} else {
  serve_commands()
}
"""

# plumber's run() as a valve worker runs it today (bench/r-cost's SERVE_R).
# With api "-": a trivial app on the same pipe server (httpuv's own cost).
SERVE_HTTPUV_R = r"""
args <- commandArgs(TRUE)
serve <- function(app) {
  server <- httpuv::startPipeServer(args[2], strtoi("077", 8L), app)
  httpuv::service(0)
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
"""


# The R side of each request-head encoding alone: decode cost in microseconds,
# heads written by driver.py, blocks interleaved, median of blocks.
class Alone:
    def __init__(self, procs: h.Procs, api: Path, mode: str = "plain", launch=rscript):
        self.name = "alone" if mode == "plain" else "alone-run"
        script = procs.workdir / "alone.R"
        script.write_text(ALONE_R)
        log_path = procs.workdir / f"{self.name}.log"
        popen = subprocess.Popen(launch(script, [str(api), mode, str(d.LOOP_R)]), cwd=api.parent,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log_path, "wb"),
                                 start_new_session=True)
        self.proc = h.Proc(self.name, popen, log_path)
        procs.procs.append(self.proc)
        self._expect("ready")
        self.per_call = 0.002

    def _expect(self, word: str) -> None:
        line = self.proc.popen.stdout.readline().decode().strip()
        if line != word:
            raise h.BenchError(f"the router-alone process said {line!r}:\n{self.proc.log_tail()}")

    def run(self, n: int) -> None:
        self.proc.popen.stdin.write(f"{n}\n".encode())
        self.proc.popen.stdin.flush()
        self._expect("done")

    def warm(self) -> None:
        self.run(300)

    def measure_n(self, n: int) -> None:
        self.run(n)

    def measure(self, seconds: float) -> tuple[int, float]:
        n = max(20, int(seconds / self.per_call))
        t0 = time.monotonic()
        self.run(n)
        wall = time.monotonic() - t0
        self.per_call = wall / n
        return n, wall


class Server:
    """A worker driven with `depth` requests in flight: 1 is valve's rule; 2
    keeps the next request waiting, so the worker never sleeps between two
    (what a queue inside the worker gives, and what valve refuses)."""

    depth = 1

    def send(self, k: int) -> None:
        raise NotImplementedError

    def recv(self, k: int) -> None:
        raise NotImplementedError

    def warm(self) -> None:
        self.measure_n(300)

    def measure_n(self, n: int) -> None:
        for k in range(n):
            self.send(0)
            self.recv(0)

    def measure(self, seconds: float) -> tuple[int, float]:
        n, t0 = 0, time.monotonic()
        for k in range(self.depth):
            self.send(k)
        k = 0
        while time.monotonic() - t0 < seconds:
            self.recv(k)
            n += 1
            self.send(k)
            k = (k + 1) % self.depth
        for _ in range(self.depth):
            self.recv(k)
            n += 1
            k = (k + 1) % self.depth
        return n, time.monotonic() - t0


class Httpuv(Server):
    def __init__(self, procs: h.Procs, api: Path, trivial: bool = False, depth: int = 1, launch=rscript,
                 start_timeout: float = 120):
        self.name = "httpuv" + ("-trivial" if trivial else "") + ("-2" if depth == 2 else "")
        self.expect = b"ok" if trivial else EXPECT
        self.depth = depth
        script = procs.workdir / "serve-httpuv.R"
        script.write_text(SERVE_HTTPUV_R)
        path = procs.workdir / f"{self.name}.sock"
        self.proc = procs.spawn(self.name, launch(script, ["-" if trivial else str(api), str(path)]), cwd=api.parent)
        h.wait_until(f"httpuv to listen on {path}", lambda: path.exists(), start_timeout, [self.proc])
        # httpuv answers one request per connection at a time: one connection per request in flight.
        self.socks = []
        for _ in range(depth):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            self.socks.append(sock)
        self.bufs = [b""] * depth

    def send(self, k: int) -> None:
        self.socks[k].sendall(HTTP_REQUEST)

    def recv(self, k: int) -> None:
        sock, buf = self.socks[k], self.bufs[k]
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise h.BenchError("httpuv closed the connection")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += sock.recv(65536)
        if not head.startswith(b"HTTP/1.1 200") or rest[:length] != self.expect:
            raise h.BenchError(f"httpuv answered {head[:40]!r}")
        self.bufs[k] = rest[length:]


class Frames(Server):
    def __init__(self, procs: h.Procs, api: Path, listener: d.Listener, encoding: str, trivial: bool = False,
                 depth: int = 1, launch=rscript, start_timeout: float = 120):
        self.name = f"frames-{encoding}" + ("-trivial" if trivial else "") + ("-2" if depth == 2 else "")
        self.expect = b"ok" if trivial else EXPECT
        self.depth = depth
        script = procs.workdir / "serve-frames.R"
        script.write_text(d.SERVE_FRAMES_R)
        env = dict(os.environ, **listener.env(self.name))
        self.proc = procs.spawn(self.name, launch(script, ["-" if trivial else str(api), str(d.LOOP_R), encoding, "TRUE"]),
                                cwd=api.parent, env=env)
        try:
            self.worker = listener.accept(self.name, start_timeout, encoding, alive=self.proc.alive)
        except d.ProtocolError as e:
            raise h.BenchError(f"{self.name}: {e}\n{self.proc.log_tail()}") from e
        self.frame = d.request_frame(d.Request("GET", "/echo?msg=hello", HEADERS, server_port="3000",
                                               remote_port="40000"), encoding)

    def send(self, k: int) -> None:
        # Frames in flight are pipelined on the one connection (the loop reads them in order).
        self.worker.sock.sendall(self.frame)

    def recv(self, k: int) -> None:
        t, flags, head, body = d.read_frame(self.worker.sock)
        a = d.parse_answer(flags, head, body)
        if t != d.ANSWER or a.status != 200 or a.body != self.expect:
            raise h.BenchError(f"{self.name} answered {a}")
