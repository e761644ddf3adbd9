#!/usr/bin/env python3
"""Three valves (real binary, real R workers on examples/plumber.R) behind
HAProxy configured like a Kubernetes Service (readyz checked every 500 ms, no
retries, no redispatch), restarted one by one under steady load: SIGTERM, wait
for the exit, start again, wait until HAProxy sees it up. Counts every request
that did not get its 200.

    rolling_restart.py [--mode tcp|http] [--drain-delay S] [--rounds N] [--expect-zero]

Prints one JSON line with the figures; with --expect-zero exits 1 unless no
request failed, every valve exited 0 and no R worker outlived its valve.
Load: closed-loop clients on keep-alive connections (as HTTP clients behind a
Service keep them): most call /echo, a few /sleep?zzz=0.3 so every drain has
requests in flight. Bounded by --max-seconds and the number of rounds.
"""

import argparse
import collections
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402


class Load:
    """Closed-loop clients through the balancer; counts answers by outcome."""

    def __init__(self, port, fast_clients, slow_clients):
        self.port = port
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes = collections.Counter()
        self.failures = []  # (seconds since start, path, what)
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self.client, args=("/echo?msg=hi",), daemon=True)
                        for _ in range(fast_clients)]
        self.threads += [threading.Thread(target=self.client, args=("/sleep?zzz=0.3",), daemon=True)
                         for _ in range(slow_clients)]

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def record(self, path, outcome):
        with self.lock:
            self.outcomes[outcome] += 1
            if outcome != "ok":
                self.failures.append((round(time.monotonic() - self.t0, 2), path, outcome))

    def client(self, path):
        conn = None
        while not self.stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body = resp.read()
                if resp.status == 200 and body:
                    self.record(path, "ok")
                else:
                    self.record(path, f"status {resp.status}")
                if resp.will_close:
                    conn.close()
                    conn = None
            except Exception as e:  # noqa: BLE001: every failure counts
                self.record(path, type(e).__name__)
                conn.close()
                conn = None
        if conn is not None:
            conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["tcp", "http"], default="tcp")
    ap.add_argument("--drain-delay", type=float, default=2.0)
    ap.add_argument("--graceful-timeout", type=float, default=15.0)
    ap.add_argument("--valves", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="restarts of every valve")
    ap.add_argument("--fast-clients", type=int, default=6)
    ap.add_argument("--slow-clients", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=240)
    ap.add_argument("--expect-zero", action="store_true")
    a = ap.parse_args()

    binary = cluster.valve_binary()
    work = cluster.workdir("valve-rolling-")
    app = os.path.join(cluster.REPO, "examples", "plumber.R")
    args = ["--n-min", "2", "--n-max", "2", "--drain-delay", str(a.drain_delay),
            "--graceful-timeout", str(a.graceful_timeout)]
    valves = [cluster.Valve(f"v{i + 1}", binary, app, work, args) for i in range(a.valves)]
    lb = cluster.HAProxy(valves, work, mode=a.mode)
    load = None
    exits = []
    problems = []
    started = time.monotonic()
    try:
        for v in valves:
            v.start()
        for v in valves:
            cluster.wait_for(f"{v.name} ready", v.ready, 120)
            v.note_workers()
        lb.start()
        for v in valves:
            lb.wait_state(v.name, "UP", 20)

        load = Load(lb.port, a.fast_clients, a.slow_clients)
        load.start()
        time.sleep(3)
        for rnd in range(a.rounds):
            for v in valves:
                if time.monotonic() - started > a.max_seconds:
                    problems.append(f"stopped early: past --max-seconds {a.max_seconds}")
                    break
                v.note_workers()
                t = time.monotonic()
                v.terminate()
                code = v.wait(timeout=a.drain_delay + a.graceful_timeout + 15)
                exits.append(code)
                stopped_in = time.monotonic() - t
                if code != 0:
                    problems.append(f"{v.name} exited {code} (1: requests were cut off)")
                left = cluster.live_pids(v.worker_pids)
                if left:
                    problems.append(f"R workers {left} outlived {v.name}")
                v.start()
                cluster.wait_for(f"{v.name} ready again", v.ready, 120)
                v.note_workers()
                lb.wait_state(v.name, "UP", 30)
                print(f"  round {rnd + 1}: {v.name} stopped in {stopped_in:.1f} s (exit {code}), "
                      f"back up after {time.monotonic() - t:.1f} s; requests so far "
                      f"{sum(load.outcomes.values())}", file=sys.stderr, flush=True)
        time.sleep(2)
    finally:
        if load:
            load.finish()
        lb.stop()
        for v in valves:
            v.note_workers()
            v.terminate()
        for v in valves:
            try:
                v.wait(timeout=a.graceful_timeout + 10)
            except Exception:  # noqa: BLE001
                v.kill()
    for v in valves:
        left = cluster.live_pids(v.worker_pids)
        if left:
            problems.append(f"R workers {left} outlived {v.name}")

    total = sum(load.outcomes.values()) if load else 0
    failed = total - (load.outcomes["ok"] if load else 0)
    result = {
        "test": "rolling-restart", "mode": a.mode, "drain_delay_s": a.drain_delay,
        "valves": a.valves, "restarts": len(exits), "requests": total, "failed": failed,
        "failures_by_kind": {k: n for k, n in load.outcomes.items() if k != "ok"} if load else {},
        "seconds": round(time.monotonic() - started, 1), "problems": problems,
    }
    print(json.dumps(result))
    if load and load.failures:
        print("  first failures (s, path, what): " + str(load.failures[:10]), file=sys.stderr)
    if a.expect_zero and (failed or problems or total == 0):
        for v in valves:
            print(f"--- {v.name} log tail ---\n{v.log_tail()}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
