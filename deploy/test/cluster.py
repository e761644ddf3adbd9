"""Several real valves behind a real HAProxy on one machine, for deploy/test's
balancer tests. Standard library only.

Every process here is started by this module and stopped by it (by pid, never
by name); everything listens on loopback ports picked free at start.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Ports below the ephemeral range, never one twice: bench/lib/harness.py says why.
sys.path.insert(0, os.path.join(REPO, "bench", "lib"))
from harness import free_port  # noqa: E402


def http_get(url, timeout=5, headers=None):
    """(status, body) of one GET on a fresh connection; (None, error) when it failed."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:  # noqa: BLE001: any failure is an answer here
        return None, repr(e)


def wait_for(what, check, timeout, every=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


_PROBES_ON_MAIN_WITH_ADMIN = {}


def probes_on_main_port_with_admin(binary):
    """Whether this valve answers /__valve__/healthz on the main port when --admin-addr is set.

    The plan (and the Helm chart) is: probes on the main port, metrics and status on the
    admin listener. valve 0.1.0 moves every /__valve__/ page to the admin listener, so
    there the tests run without --admin-addr and read the status on the main port.
    """
    if binary not in _PROBES_ON_MAIN_WITH_ADMIN:
        port, admin = free_port(), free_port()
        app = os.path.join(REPO, "examples", "plumber.R")
        p = subprocess.Popen([binary, "-f", app, "--host", "127.0.0.1", "--port", str(port),
                              "--admin-addr", f"127.0.0.1:{admin}", "--n-min", "1"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            code = None
            deadline = time.monotonic() + 30
            while code is None and time.monotonic() < deadline:
                code = http_get(f"http://127.0.0.1:{port}/__valve__/healthz", timeout=2)[0]
                if code is None:
                    time.sleep(0.1)
            _PROBES_ON_MAIN_WITH_ADMIN[binary] = code == 200
        finally:
            p.terminate()
            p.wait()
    return _PROBES_ON_MAIN_WITH_ADMIN[binary]


class Valve:
    """One valve process on a fixed port (kept across restarts), its admin pages on
    another when the binary keeps probes on the main port (see above)."""

    def __init__(self, name, binary, app, workdir, args=()):
        self.name = name
        self.binary = binary
        self.app = app
        self.port = free_port()
        self.admin_port = free_port() if probes_on_main_port_with_admin(binary) else self.port
        self.args = list(args)
        self.log_path = os.path.join(workdir, f"valve-{name}.log")
        self.proc = None
        self.starts = 0
        self.worker_pids = set()
        # The operator token valve's status and metrics pages ask for (0600, this user's).
        self.token_file = os.path.join(workdir, f"valve-{name}.token")
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, secrets.token_hex(32).encode())
        os.close(fd)

    def admin_headers(self):
        with open(self.token_file) as f:
            return {"Authorization": "Bearer " + f.read().strip()}

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        log = open(self.log_path, "ab")
        log.write(f"--- start {self.starts + 1} ---\n".encode())
        log.flush()
        cmd = [self.binary, "-f", self.app, "--host", "127.0.0.1", "--port", str(self.port),
               "--no-access-log", "--admin-token-file", self.token_file, *self.args]
        if self.admin_port != self.port:
            cmd += ["--admin-addr", f"127.0.0.1:{self.admin_port}"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.starts += 1
        log.close()

    def ready(self):
        return http_get(self.url + "/__valve__/readyz", timeout=2)[0] == 200

    def status(self):
        code, body = http_get(f"http://127.0.0.1:{self.admin_port}/__valve__/status", timeout=5,
                              headers=self.admin_headers())
        if code != 200:
            return None
        return json.loads(body)

    def note_workers(self):
        """Remember the pids of this valve's R workers, to check later that none outlived it."""
        s = self.status()
        if s:
            for w in s.get("workers", []):
                if w.get("pid"):
                    self.worker_pids.add(int(w["pid"]))

    def sessions(self):
        s = self.status() or {}
        return sum(w.get("sessions", 0) for w in s.get("workers", []))

    def terminate(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines=15):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def live_pids(pids):
    """The pids of `pids` that still exist (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                alive.append(pid)
        except OSError:
            pass
    return alive


class HAProxy:
    """HAProxy in front of `valves`, health-checking /__valve__/readyz.

    mode "tcp" balances connections as a Kubernetes Service (kube-proxy) does: a
    client's keep-alive connection stays on the pod it reached. mode "http"
    balances requests, as an Ingress controller does. Either way: no retries, no
    redispatch, so a request sent to a valve that cannot take it fails.
    `cookie` (http only) adds HAProxy's own affinity cookie of that name.
    """

    def __init__(self, valves, workdir, mode="tcp", inter_ms=500, fall=2, rise=2, cookie=None):
        self.valves = valves
        self.port = free_port()
        self.workdir = workdir
        self.sock = os.path.join(workdir, "haproxy.sock")
        self.cfg = os.path.join(workdir, "haproxy.cfg")
        self.log_path = os.path.join(workdir, "haproxy.log")
        servers = []
        for v in valves:
            line = f"    server {v.name} 127.0.0.1:{v.port} check"
            if cookie:
                line += f" cookie {v.name}"
            servers.append(line)
        http_only = ""
        if mode == "http":
            http_only = "    option forwardfor\n"
            if cookie:
                http_only += f"    cookie {cookie} insert indirect nocache httponly\n"
        with open(self.cfg, "w") as f:
            f.write(f"""global
    maxconn 4096
    stats socket {self.sock} mode 600 level admin
defaults
    mode {mode}
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
    # Like a Kubernetes Service: a request that reaches a valve that cannot
    # take it is not tried again elsewhere.
    retries 0
    no option redispatch
frontend front
    bind 127.0.0.1:{self.port}
    default_backend valves
backend valves
    balance roundrobin
{http_only}    option httpchk GET /__valve__/readyz
    http-check expect status 200
    default-server inter {inter_ms}ms fall {fall} rise {rise}
""" + "\n".join(servers) + "\n")
        self.proc = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        check = subprocess.run(["haproxy", "-c", "-q", "-f", self.cfg], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy config: {check.stderr or check.stdout}")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", self.cfg], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log)
        log.close()
        wait_for("haproxy's stats socket", lambda: os.path.exists(self.sock), 10)

    def command(self, cmd):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.sock)
            s.sendall(cmd.encode() + b"\n")
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        return out.decode()

    def states(self):
        """{server name: "UP" | "DOWN" | ...} from HAProxy's stats."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            if not line:
                continue
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == "valves" and row.get("svname") not in ("FRONTEND", "BACKEND"):
                out[row["svname"]] = row["status"].split()[0]
        return out

    def wait_state(self, name, state, timeout):
        wait_for(f"haproxy to see {name} {state}", lambda: self.states().get(name) == state, timeout, 0.05)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def valve_binary():
    path = os.environ.get("VALVE_BIN") or os.path.join(REPO, "target", "release", "valve")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"no valve binary at {path}: set VALVE_BIN or run cargo build --release")
    return path


def workdir(prefix):
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("VALVE_DEPLOY_WORK"))
