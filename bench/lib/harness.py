"""What every benchmark script shares: starting processes, waiting for them,
stopping them (and everything they started), and describing the machine.

Every process a benchmark starts goes through `Procs.spawn`: it gets its own
session (so Ctrl-C on the terminal reaches only the script, which then stops
everything in order) and is stopped by `Procs.stop_all`, which also hunts down
descendants that left the process group (valve puts each R worker in a group
of its own). Every wait takes a deadline.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.util
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO = BENCH_DIR.parent
EXAMPLE_API = REPO / "examples" / "plumber.R"


class BenchError(Exception):
    """A benchmark could not run (as opposed to: it ran and missed a target)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Signals: turn SIGTERM and SIGHUP into the same clean exit as Ctrl-C.


class Interrupted(BaseException):
    pass


def install_signal_handlers() -> None:
    def handler(signum, _frame):
        # Ignore repeats while we clean up; the first one is enough.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def raise_fd_limit(want: int = 8192) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# --------------------------------------------------------------------------
# /proc helpers


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest  # rest[0] is field 3 (state)


def proc_starttime(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[19]) if f else None


def cpu_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks."""
    f = _stat_fields(pid)
    if not f:
        return 0
    return int(f[11]) + int(f[12])


CLK_TCK = os.sysconf("SC_CLK_TCK")
# The CPUs this machine has (every CPU figure in the benchmarks counts them).
NCPU = os.cpu_count() or 1


def _machine_ticks() -> tuple[int, int]:
    """CPU ticks all CPUs spent (busy, idle + iowait), from /proc/stat."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return user + nice + system + irq + softirq + steal, idle + iowait


def machine_busy_ticks() -> int:
    """CPU ticks every CPU spent not idle, from /proc/stat."""
    return _machine_ticks()[0]


def machine_idle_ticks() -> int:
    """CPU ticks every CPU spent idle (idle + iowait), from /proc/stat."""
    return _machine_ticks()[1]


class NoiseMeter:
    """How much CPU processes outside the benchmark used while it measured:
    the machine's busy ticks minus the ticks of this script, the children it
    reaped (wrk) and every process it started (and their descendants)."""

    def __init__(self, procs: "Procs"):
        self.procs = procs
        self.busy = 0
        self.ours = 0
        self.wall = 0.0

    def _ours(self) -> int:
        t = os.times()
        own = (t.user + t.system + t.children_user + t.children_system) * CLK_TCK
        live = 0
        for p in self.procs.procs:
            for pid in [p.pid, *descendants(p.pid)]:
                live += cpu_ticks(pid)
        return int(own) + live

    def __enter__(self):
        self._b0, self._o0, self._t0 = machine_busy_ticks(), self._ours(), time.monotonic()
        return self

    def __exit__(self, *exc):
        self.busy += machine_busy_ticks() - self._b0
        self.ours += self._ours() - self._o0
        self.wall += time.monotonic() - self._t0
        return False

    @property
    def other_cpus(self) -> float:
        """CPUs' worth of time used by other processes (0.5 = half a CPU)."""
        if not self.wall:
            return 0.0
        return max(0, self.busy - self.ours) / CLK_TCK / self.wall


def wait_for_quiet(procs: "Procs", max_wait: float, threshold: float = 0.15, window: float = 2.0) -> float:
    """Waits (at most max_wait seconds) for a `window` in which processes outside
    the benchmark use less than `threshold` CPUs; returns the last level seen."""
    deadline = time.monotonic() + max_wait
    level = 0.0
    while True:
        with NoiseMeter(procs) as m:
            time.sleep(window)
        level = m.other_cpus
        if level < threshold or time.monotonic() + window > deadline:
            return level


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        f = _stat_fields(int(entry))
        if f:
            children.setdefault(int(f[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def vm_status(pid: int, key: str) -> int | None:
    """A field of /proc/PID/status in kB (VmRSS, VmHWM, ...)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# --------------------------------------------------------------------------
# Processes


_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port free now, for a process that will bind it later.

    Taken below the kernel's ephemeral range (net.ipv4.ip_local_port_range),
    where neither an outgoing connection's source port nor a bind to port 0
    (valve, wrk, R workers meanwhile) can take it before its process binds it;
    never the same port twice in one run."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    if ephemeral_low > 12000:
        for _ in range(500):
            port = random.randint(10000, ephemeral_low - 1)
            if port in _PORTS_GIVEN:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _PORTS_GIVEN.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen, log_path: Path):
        self.name = name
        self.popen = popen
        self.pid = popen.pid
        self.log_path = log_path
        self.port: int | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 25) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"    {self.name}| {l}" for l in lines[-n:])


class Procs:
    """Owns every process a benchmark starts, and stops them all at the end."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[Proc] = []

    def spawn(self, name: str, argv: list[str], cwd: Path | None = None,
              env: dict | None = None, stdout_path: Path | None = None, stderr_pipe: bool = False) -> Proc:
        """`stderr_pipe`: stderr goes to a pipe nobody reads (a stalled log reader)."""
        log_path = self.workdir / f"{name}.log"
        out = open(stdout_path or log_path, "wb")
        if stderr_pipe:
            err = subprocess.PIPE
        else:
            err = open(log_path, "ab") if stdout_path else subprocess.STDOUT
        try:
            popen = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True,
            )
        except FileNotFoundError as e:
            raise BenchError(f"cannot start {name}: {argv[0]} not found ({e})") from e
        finally:
            out.close()
            if stdout_path and not stderr_pipe:
                err.close()
        p = Proc(name, popen, log_path)
        self.procs.append(p)
        return p

    def stop(self, p: Proc, grace: float = 10.0) -> None:
        """SIGTERM the process group, wait up to `grace`, then SIGKILL the group
        and any descendant that left it. Waits for every one of them to go."""
        # Snapshot descendants (with start times, so a recycled pid is never hit).
        family = [(d, proc_starttime(d)) for d in descendants(p.pid)]
        if p.alive():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log(f"{p.name} ignored SIGTERM for {grace:.0f}s; killing it")
        # New descendants may have appeared since the snapshot; take them too.
        family += [(d, proc_starttime(d)) for d in descendants(p.pid)]
        for sig_target in [p.pid]:
            try:
                os.killpg(sig_target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            p.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5
        for pid, start in family:
            while proc_starttime(pid) == start and start is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                if time.monotonic() > deadline:
                    log(f"process {pid} (started by {p.name}) would not die")
                    break
                time.sleep(0.02)
        if p in self.procs:
            self.procs.remove(p)

    def check_alive(self, what: str) -> None:
        """Fails the benchmark if a server it started died (its figures would be wrong)."""
        for p in self.procs:
            if not p.name.startswith("wrk") and not p.alive():
                raise BenchError(f"{p.name} (pid {p.pid}) exited with status {p.popen.returncode} "
                                 f"{what}:\n{p.log_tail()}")

    def stop_all(self) -> None:
        for p in reversed(list(self.procs)):
            self.stop(p)


def wait_until(what: str, cond, deadline_s: float, procs: list[Proc] = (), interval: float = 0.05):
    """Polls cond() until it returns a truthy value or the deadline passes;
    fails early if one of `procs` dies."""
    deadline = time.monotonic() + deadline_s
    while True:
        v = cond()
        if v:
            return v
        for p in procs:
            if not p.alive():
                raise BenchError(f"{p.name} exited (status {p.popen.returncode}) while waiting for {what}:\n{p.log_tail()}")
        if time.monotonic() > deadline:
            tails = "\n".join(p.log_tail() for p in procs)
            raise BenchError(f"timed out after {deadline_s:.0f}s waiting for {what}\n{tails}")
        time.sleep(interval)


def http_get_status(port: int, path: str = "/echo?msg=ready", timeout: float = 2.0) -> int | None:
    """One GET on a fresh connection; the status code, or None if it failed."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            head = b""
            while b"\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                head += chunk
            m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
            return int(m.group(1)) if m else None
    except OSError:
        return None


def wait_http_ok(p: Proc, port: int, deadline_s: float = 60.0, path: str = "/echo?msg=ready") -> None:
    wait_until(f"{p.name} to answer on 127.0.0.1:{port}",
               lambda: http_get_status(port, path) == 200, deadline_s, [p], interval=0.1)


def start_plumber(procs: Procs, name: str, api: Path = EXAMPLE_API) -> Proc:
    """A plain plumber process, the way users run one: pr_run(pr(file))."""
    port = free_port()
    code = f"plumber::pr_run(plumber::pr({str(api)!r}), host='127.0.0.1', port={port})"
    p = procs.spawn(name, ["Rscript", "-e", code], cwd=api.parent)
    p.port = port
    return p


VALVE_LOG = "info,valve::access=off"

_READY = re.compile(r"valve: serving .* on http://[^:]+:(\d+)[/ ]")


def ready_info(out: Path) -> dict | None:
    """valve's ready line: one JSON object on stdout (older builds printed a
    sentence instead, which gives the port only)."""
    try:
        text = out.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if '"event":"ready"' in line:
            try:
                ready = json.loads(line)
            except ValueError:
                return None
            remember_admin(ready)
            return ready
    m = _READY.search(text)
    return {"port": int(m.group(1)), "admin_url": None} if m else None


# Each valve's admin port and its operator token: every admin page but
# health and readiness asks for it (`Authorization: Bearer TOKEN`).
_ADMIN_TOKENS: dict[int, str] = {}


def remember_admin(ready: dict) -> None:
    """Notes the operator token of the valve whose ready line this is, by its admin port."""
    path = ready.get("admin_token_file")
    if not path:
        return
    try:
        token = Path(path).read_text().strip()
    except OSError:
        return
    admin = ready.get("admin_url") or ready.get("url") or ""
    try:
        _ADMIN_TOKENS[int(admin.rsplit(":", 1)[1])] = token
    except (IndexError, ValueError):
        pass


def admin_headers(port: int) -> dict[str, str]:
    """The header valve's admin pages on `port` take (none if that valve said no token)."""
    token = _ADMIN_TOKENS.get(port)
    return {"Authorization": f"Bearer {token}"} if token else {}


def start_valve(procs: Procs, valve_bin: Path, name: str, n_max: int, n_min: int,
                api: Path = EXAMPLE_API, extra: list[str] = (), stderr_pipe: bool = False,
                env_extra: dict[str, str] | None = None) -> Proc:
    """valve on a port it picks itself (-p 0); ready when it prints its ready line.
    `env_extra`: variables set in valve's environment on top of this process's."""
    out = procs.workdir / f"{name}.stdout"
    argv = [str(valve_bin), "-f", str(api), "-n", str(n_max), "--n-min", str(n_min),
            "--host", "127.0.0.1", "-p", "0", *extra]
    # info keeps worker starts and exits and the signal that stopped valve (the
    # log tail shows them if it dies during a run); the per-request access log
    # is off, like nginx's `access_log off` here.
    env = dict(os.environ, **(env_extra or {}))
    env.setdefault("VALVE_LOG", VALVE_LOG)
    p = procs.spawn(name, argv, env=env, stdout_path=out, stderr_pipe=stderr_pipe)
    p.argv = argv
    p.ready = wait_until(f"{name} to print its ready line", lambda: ready_info(out), 120, [p])
    p.port = p.ready["port"]
    # valve's own pages: on the admin listener when it has one, else the main port.
    admin = p.ready.get("admin_url")
    p.admin_port = int(admin.rsplit(":", 1)[1]) if admin else p.port
    # Any app (a Shiny app has no /echo): valve's readiness, on the main port.
    wait_http_ok(p, p.port, 30, "/__valve__/readyz")
    return p


def pin_binary(binary: Path, workdir: Path) -> Path:
    """A private copy of the binary to run, so a rebuild of target/release
    during the benchmark neither changes what is measured nor breaks perf's
    symbols."""
    (workdir / "bin").mkdir(parents=True, exist_ok=True)
    dst = workdir / "bin" / binary.name
    shutil.copy2(binary, dst)
    # The commit it was pinned at: the tree may move on while it runs.
    _PINNED_AT[dst] = _commit()
    return dst


_PINNED_AT: dict[Path, str] = {}


def _commit() -> str:
    """The repository's commit, and whether src/ or Cargo.* differ from it."""
    commit = _cmd_out(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"],
                           capture_output=True, text=True).stdout.strip()
    return commit + (" + uncommitted changes in src/ or Cargo.*" if dirty else "")


def valve_binary(no_build: bool) -> Path:
    """The release binary; built with cargo unless told not to (or VALVE_BIN is set)."""
    if os.environ.get("VALVE_BIN"):
        b = Path(os.environ["VALVE_BIN"]).resolve()
        if not os.access(b, os.X_OK):
            raise BenchError(f"VALVE_BIN={b} is not an executable file")
        return b
    b = REPO / "target" / "release" / "valve"
    if not no_build:
        if not shutil.which("cargo"):
            raise BenchError("cargo not found: install Rust (https://rustup.rs) or set VALVE_BIN to a built valve")
        log("building valve: cargo build --release")
        r = subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=REPO, timeout=1800)
        if r.returncode != 0:
            raise BenchError("cargo build --release failed (see above); set VALVE_BIN to benchmark another build")
    if not os.access(b, os.X_OK):
        raise BenchError(f"{b} not found: run `cargo build --release` or drop --no-build")
    return b


# --------------------------------------------------------------------------
# Installing what a benchmark needs


def ensure_r_plumber() -> None:
    ok = shutil.which("Rscript") and subprocess.run(
        ["Rscript", "-e", "suppressMessages(library(plumber))"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    if not ok:
        apt_install(["r-base-core", "r-cran-plumber"])


_apt_updated = False


def apt_install(pkgs: list[str]) -> None:
    """apt-get install, without letting the packages start their services
    (nginx-light would otherwise start a daemon on port 80)."""
    global _apt_updated
    if not shutil.which("apt-get"):
        raise BenchError(f"missing {' '.join(pkgs)} and no apt-get to install them; install them by hand")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = False
    if os.geteuid() == 0 and not policy.exists():
        policy.write_text("#!/bin/sh\n# written by valve's bench/ while it installs packages\nexit 101\n")
        policy.chmod(0o755)
        made_policy = True
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if not _apt_updated:
            log("apt-get update")
            subprocess.run(sudo + ["apt-get", "update", "-qq"], env=env, timeout=600)
            _apt_updated = True
        log(f"apt-get install -y {' '.join(pkgs)}")
        r = subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", *pkgs], env=env, timeout=1200)
        if r.returncode != 0:
            raise BenchError(f"apt-get install {' '.join(pkgs)} failed")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)


def ensure_matplotlib() -> bool:
    """matplotlib for the chart, installed from PyPI if missing; False if it cannot be had."""
    if importlib.util.find_spec("matplotlib") is not None:
        return True
    log("installing matplotlib from PyPI (for the chart)")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"], timeout=600)
    if r.returncode != 0:
        log("could not install matplotlib: the chart is skipped")
        return False
    importlib.invalidate_caches()
    return importlib.util.find_spec("matplotlib") is not None


# --------------------------------------------------------------------------
# Statistics


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[k - 1]


# --------------------------------------------------------------------------
# The machine and versions, for RESULTS.md


def _cmd_out(argv: list[str], pattern: str | None = None) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "n/a"
    text = (r.stdout + r.stderr).strip()
    if pattern:
        m = re.search(pattern, text)
        return m.group(1) if m else "n/a"
    return text.splitlines()[0] if text else "n/a"


def machine_info(valve_bin: Path | None, want: tuple[str, ...] = ("nginx", "wrk")) -> dict[str, str]:
    cpu = "n/a"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = _PINNED_AT.get(valve_bin) if valve_bin else None
    commit = commit or _commit()
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(NCPU),
        "cpu": cpu,
        "memory": _mem_total(),
        "kernel": platform.release(),
        "R": _cmd_out(["R", "--version"], r"R version (\S+)"),
        "plumber": _cmd_out(["Rscript", "-e", "cat(format(packageVersion('plumber')))"], r"([\d.]+)"),
        "valve": f"{_cmd_out([str(valve_bin), '--version']) if valve_bin else 'n/a'}, git {commit}",
        "python": platform.python_version(),
    }
    if "nginx" in want:
        info["nginx"] = _cmd_out(["nginx", "-v"], r"nginx/(\S+)")
    if "wrk" in want:
        info["wrk"] = _cmd_out(["wrk", "--version"], r"wrk (\S+)")
    return info


def _mem_total() -> str:
    kb = vm_meminfo("MemTotal")
    return f"{kb / 1024 / 1024:.0f} GiB" if kb else "n/a"


def vm_meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def command_line() -> str:
    try:
        rel = os.path.relpath(sys.argv[0], REPO)
    except ValueError:
        rel = sys.argv[0]
    return " ".join(shlex.quote(a) for a in [rel, *sys.argv[1:]])


def machine_md(info: dict[str, str], command: str) -> str:
    rows = [
        ("Command (from the repository root)", f"`{command}`"),
        ("Date", info["date"]),
        ("Machine", f"{info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, Linux {info['kernel']}"),
        ("R / plumber", f"R {info['R']}, plumber {info['plumber']}"),
        ("valve", info["valve"]),
    ]
    if "nginx" in info:
        rows.append(("nginx / wrk", f"nginx {info['nginx']}, wrk {info['wrk']}"))
    rows.append(("Python (load clients)", info["python"]))
    return "\n".join(f"- **{k}:** {v}" for k, v in rows)


def write_results_section(name: str, body: str) -> Path:
    """Replaces (or appends) the section of bench/RESULTS.md between this
    benchmark's markers, leaving the other benchmarks' sections alone."""
    path = BENCH_DIR / "RESULTS.md"
    begin, end = f"<!-- {name}: begin (written by {name}; do not edit by hand) -->", f"<!-- {name}: end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else (
        "# Benchmark results\n\n"
        "Each section below is rewritten by the script it names, from one run of it; "
        "every figure in a section was measured in that run.\n")
    pat = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pat.search(text):
        text = pat.sub(lambda _m: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def make_workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
