#!/usr/bin/env python3
"""A Shiny app (Shiny's own examples/01_hello) on two valves behind HAProxy with
cookie affinity (HAProxy's own cookie, as an Ingress controller's): each browser
stays on its instance across reloads and comes back to its own session when
the balancer cuts its connection, and when one instance is stopped (SIGTERM)
its browsers move to the other by themselves (a new session with their inputs,
no page reload) while the other's browsers keep their live sessions. Real chromium (shiny-affinity.mjs), real R workers.

    shiny_affinity.py [--browsers N]

Prints one JSON line; exits 1 when a check failed.
"""

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
COOKIE = "lb"


def shiny_hello():
    r = subprocess.run(["Rscript", "--vanilla", "-e", 'cat(system.file("examples", "01_hello", package = "shiny"))'],
                       capture_output=True, text=True, check=True)
    path = r.stdout.strip()
    if not path:
        raise SystemExit("shiny's examples/01_hello not found: is r-cran-shiny installed?")
    return path


class Browsers:
    """The node script, its JSON lines read with a deadline. Its own process group,
    so chromium's processes go with it."""

    def __init__(self, url, count):
        self.proc = subprocess.Popen(["node", os.path.join(HERE, "shiny-affinity.mjs"), url, str(count), COOKIE],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE,
                                     start_new_session=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, what, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"no answer from the browsers in {timeout} s ({what})") from None
        if line is None:
            raise RuntimeError(f"the browser script ended before {what}")
        return json.loads(line)

    def send(self, obj):
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def close(self, timeout):
        self.proc.stdin.close()
        return self.proc.wait(timeout=timeout)

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--browsers", type=int, default=4)
    a = ap.parse_args()

    binary = cluster.valve_binary()
    work = cluster.workdir("valve-shiny-")
    app = shiny_hello()
    args = ["--n-min", "1", "--n-max", "2", "--drain-delay", "1", "--graceful-timeout", "10"]
    valves = [cluster.Valve(name, binary, app, work, args) for name in ("a", "b")]
    by_name = {v.name: v for v in valves}
    lb = cluster.HAProxy(valves, work, mode="http", cookie=COOKIE)
    node = None
    problems = []
    result = {"test": "shiny-affinity", "browsers": a.browsers}
    started = time.monotonic()
    try:
        for v in valves:
            v.start()
        for v in valves:
            cluster.wait_for(f"{v.name} ready", v.ready, 120)
        lb.start()
        for v in valves:
            lb.wait_state(v.name, "UP", 20)

        node = Browsers(lb.url, a.browsers)
        placed = node.read("placing its browsers", 240)["placed"]
        result["placed"] = {name: [p["browser"] for p in placed if p["instance"] == name] for name in by_name}
        # What the browsers' cookies say must match what each valve holds.
        for name, v in by_name.items():
            want = len(result["placed"][name])
            cluster.wait_for(f"{name} to hold {want} session(s)", lambda v=v, want=want: v.sessions() == want, 15)
        if not all(result["placed"].values()):
            problems.append(f"round robin left an instance without browsers: {result['placed']}")
        # Cut every browser's connection at the balancer: each comes back to
        # its own session on its own instance (the balancer's cookie).
        for v in valves:
            lb.command(f"shutdown sessions server valves/{v.name}")
        node.send({"cut": True})
        result.update(node.read("coming back after the cut", 120))
        # Stop the instance holding browser 0; tell the browsers once HAProxy took it out.
        stop = by_name[placed[0]["instance"]]
        t = time.monotonic()
        stop.terminate()
        lb.wait_state(stop.name, "DOWN", 10)
        result["out_of_balancer_s"] = round(time.monotonic() - t, 2)
        node.send({"stopped": stop.name})
        result.update(node.read("moving its browsers", 180))
        # Every browser is on the other instance now, and it holds every session.
        other = next(v for v in valves if v is not stop)
        try:
            cluster.wait_for(f"{other.name} to hold every session", lambda: other.sessions() == a.browsers, 15)
        except TimeoutError:
            problems.append(f"{other.name} holds {other.sessions()} sessions, not {a.browsers}")
        if node.close(timeout=60) != 0:
            problems.append("the browser script failed")
        # The stopped valve finishes its drain once its browsers left: a clean exit.
        code = stop.wait(timeout=30)
        result["stopped_exit"] = code
        if code != 0:
            problems.append(f"{stop.name} exited {code}")
    except Exception as e:  # noqa: BLE001: reported below
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        if node:
            node.stop()
        lb.stop()
        for v in valves:
            v.terminate()
        for v in valves:
            try:
                v.wait(timeout=20)
            except Exception:  # noqa: BLE001
                v.kill()
    result["seconds"] = round(time.monotonic() - started, 1)
    result["problems"] = problems
    print(json.dumps(result))
    if problems:
        for v in valves:
            print(f"--- {v.name} log tail ---\n{v.log_tail()}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
