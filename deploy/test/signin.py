#!/usr/bin/env python3
"""Sign-in through the real oauth2-proxy in front of valve, with a mock OpenID
Connect provider (deploy/test/mockoidc, built on github.com/oauth2-proxy/mockoidc)
behind it. valve trusts 127.0.0.1 (where oauth2-proxy connects from) and
nobody else. Real chromium (signin.mjs) signs in and checks:

  - a Shiny app sees the signed-in user in session$user and session$groups,
    although the browser sends a forged Shiny-Server-Credentials header on
    every request (oauth2-proxy passes it on: valve must not);
  - a plumber API sees X-Forwarded-User/-Email/-Groups of the signed-in user;
  - an app whose allow list names someone else answers 403 from valve;
  - a user outside an app's allowed groups gets 403 from valve for it;
  - a client on another loopback address (127.0.0.2, untrusted) that sends
    identity headers straight to valve is nobody: its headers never reach R,
    and apps with allow lists refuse it.

Then forward auth (`auth_url`): a second valve, trusting nobody, asks a
second oauth2-proxy (the auth service only: `--upstream=static://202`,
`--set-xauthrequest`) at /oauth2/auth who each request is, with its cookies.
Chromium goes to valve directly, is sent to oauth2-proxy's /oauth2/start
with the full URL to come back to (`sign_in_url = ...?rd={url}`), signs
in, comes back (oauth2-proxy's cookie for 127.0.0.1 holds on every port),
and the Shiny app shows session$user; the API sees the user; the restricted
app answers 403; bob (not in the Shiny app's group) gets 403, not a loop; a
client with no cookie is served anonymously by the API (its forged identity
headers dropped) and refused by the restricted app.

    signin.py

Prints one JSON line; exits 1 when a check failed.
"""

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def tool(env, name):
    """A Go tool deploy/install-deps built: $ENV, else in the cache's bin or Go's bin."""
    if os.environ.get(env):
        return os.environ[env]
    cache = os.environ.get("VALVE_DEPLOY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "valve-deploy")
    gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip() \
        if subprocess.run(["sh", "-c", "command -v go"], capture_output=True).returncode == 0 else ""
    for d in [os.path.join(cache, "bin"), os.path.join(gopath, "bin") if gopath else None]:
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    raise SystemExit(f"{name} not found: run deploy/install-deps (or set {env})")


class Proc:
    """A child in its own process group, its output to a log file."""

    def __init__(self, name, cmd, work, stdout=None, stdin=None):
        self.name = name
        self.log_path = os.path.join(work, f"{name}.log")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=stdin or subprocess.DEVNULL, stdout=stdout or log, stderr=log,
                                     start_new_session=True)
        log.close()

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except Exception:  # noqa: BLE001
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self, lines=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def straight(port, path, headers, source="127.0.0.2"):
    """A GET straight to valve from another loopback address: (status, body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def queue_user(control, subject, email, groups):
    body = json.dumps({"subject": subject, "email": email, "username": subject, "groups": groups}).encode()
    req = urllib.request.Request(control + "/user", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 204, r.status


def sign_in(base):
    r = subprocess.run(["node", os.path.join(HERE, "signin.mjs"), base], capture_output=True, text=True,
                       cwd=HERE, timeout=240)
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"signin.mjs failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def proxy_args(provider, port, *extra):
    base = f"http://127.0.0.1:{port}"
    return [
        tool("OAUTH2_PROXY", "oauth2-proxy"),
        "--provider=oidc", f"--oidc-issuer-url={provider['issuer']}",
        f"--client-id={provider['client_id']}", f"--client-secret={provider['client_secret']}",
        "--cookie-secret=" + os.urandom(16).hex(), "--cookie-secure=false", "--email-domain=*",
        f"--http-address=127.0.0.1:{port}", f"--redirect-url={base}/oauth2/callback", "--skip-provider-button",
        "--scope=openid email profile groups", *extra,
    ]


def forward_auth(binary, work, provider, procs, check, result):
    """valve with auth_url asking oauth2-proxy, no trusted proxies; the browser goes to valve."""
    valve_port, proxy_port = cluster.free_port(), cluster.free_port()
    proxy_base = f"http://127.0.0.1:{proxy_port}"
    config = os.path.join(work, "valve-auth.toml")
    token_file = os.path.join(work, "valve-auth.token")
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    token = secrets.token_hex(32)
    os.write(fd, token.encode())
    os.close(fd)
    with open(config, "w") as f:
        f.write(f"""auth_url = "{proxy_base}/oauth2/auth"
admin_token_file = "{token_file}"
auth_cache = 5
sign_in_url = "{proxy_base}/oauth2/start?rd={{url}}"
admin_on_main = true

[[app]]
name = "api"
path = "/api"
file = "{HERE}/signin/whoami.R"

[[app]]
name = "shiny"
path = "/shiny"
file = "{HERE}/signin/app.R"
allow_groups = ["engineering"]

[[app]]
name = "admin"
path = "/admin"
file = "{HERE}/signin/whoami.R"
allow_users = ["root@example.com"]
""")
    valve = Proc("valve-auth", [binary, "--config", config, "--host", "127.0.0.1", "--port", str(valve_port)], work)
    procs.append(valve)
    proxy = Proc("oauth2-proxy-auth", proxy_args(
        provider, proxy_port, "--upstream=static://202", "--set-xauthrequest", "--reverse-proxy",
        "--whitelist-domain=127.0.0.1:*"), work)
    procs.append(proxy)
    cluster.wait_for("valve (auth_url) ready", lambda: cluster.http_get(
        f"http://127.0.0.1:{valve_port}/__valve__/readyz", timeout=2)[0] == 200, 120)
    cluster.wait_for("oauth2-proxy (auth) ready",
                     lambda: cluster.http_get(proxy_base + "/ping", timeout=2)[0] == 200, 30)
    base = f"http://127.0.0.1:{valve_port}"

    queue_user(provider["control"], "alice", "alice@example.com", ["engineering", "r users"])
    alice = sign_in(base)
    result["auth_url_alice"] = alice
    check("auth_url: alice signed in through /oauth2/start and came back",
          alice.get("signed_in") is True and "error" not in alice, alice)
    check("auth_url: alice's Shiny page", alice.get("shiny_status") == 200, alice.get("shiny_status"))
    check("auth_url: session$user is alice", alice.get("shiny_user") == "alice", alice.get("shiny_user"))
    check("auth_url: session$groups", alice.get("shiny_groups") == "engineering,r users", alice.get("shiny_groups"))
    api = alice.get("api") or {}
    check("auth_url: plumber's X-Forwarded-User", api.get("user") == "alice", api)
    check("auth_url: plumber's X-Forwarded-Email", api.get("email") == "alice@example.com", api)
    check("auth_url: no forged header reaches plumber", "mallory" not in json.dumps(api), api)
    check("auth_url: admin refuses alice with 403", alice.get("admin_status") == 403, alice.get("admin_status"))

    queue_user(provider["control"], "bob", "bob@example.com", ["sales"])
    bob = sign_in(base)
    result["auth_url_bob"] = bob
    check("auth_url: the Shiny app refuses bob with 403", bob.get("shiny_status") == 403, bob.get("shiny_status"))
    check("auth_url: the API sees bob", (bob.get("api") or {}).get("user") == "bob", bob.get("api"))

    forged = {"X-Forwarded-User": "root@example.com", "X-Auth-Request-User": "root@example.com"}
    status, body = straight(valve_port, "/api/whoami", forged, source="127.0.0.1")
    seen = json.loads(body) if status == 200 else body
    result["auth_url_anonymous_api"] = seen
    check("auth_url: no cookie, the open API serves anonymously",
          status == 200 and seen.get("user") == "", (status, body[:200]))
    status, body = straight(valve_port, "/admin/whoami", forged, source="127.0.0.1")
    check("auth_url: no cookie, the restricted app answers 403", status == 403, (status, body[:200]))
    status, metrics = cluster.http_get(f"{base}/__valve__/metrics", timeout=10,
                                       headers={"Authorization": "Bearer " + token})
    metrics = metrics.decode(errors="replace") if isinstance(metrics, bytes) else str(metrics)
    allowed = [line for line in metrics.splitlines() if line.startswith('valve_auth_requests_total{result="allowed"}')]
    result["auth_url_allowed"] = allowed
    check("auth_url: valve asked oauth2-proxy", bool(allowed) and float(allowed[0].split()[-1]) >= 2, allowed)


def main():
    binary = cluster.valve_binary()
    work = cluster.workdir("valve-signin-")
    problems = []
    result = {"test": "signin"}
    started = time.monotonic()
    procs = []

    def check(what, ok, seen):
        if not ok:
            problems.append(f"{what}: {seen}")

    try:
        oidc = Proc("mockoidc", [tool("MOCKOIDC", "mockoidc")], work, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
        procs.append(oidc)
        provider = json.loads(oidc.proc.stdout.readline())

        valve_port, proxy_port = cluster.free_port(), cluster.free_port()
        config = os.path.join(work, "valve.toml")
        with open(config, "w") as f:
            f.write(f"""trusted_proxies = ["127.0.0.1/32"]

[[app]]
name = "api"
path = "/api"
file = "{HERE}/signin/whoami.R"

[[app]]
name = "shiny"
path = "/shiny"
file = "{HERE}/signin/app.R"
allow_groups = ["engineering"]

[[app]]
name = "admin"
path = "/admin"
file = "{HERE}/signin/whoami.R"
allow_users = ["root@example.com"]
""")
        valve = Proc("valve", [binary, "--config", config, "--host", "127.0.0.1", "--port", str(valve_port)], work)
        procs.append(valve)
        cluster.wait_for("valve ready", lambda: cluster.http_get(
            f"http://127.0.0.1:{valve_port}/__valve__/readyz", timeout=2)[0] == 200, 120)

        base = f"http://127.0.0.1:{proxy_port}"
        proxy = Proc("oauth2-proxy", proxy_args(provider, proxy_port, f"--upstream=http://127.0.0.1:{valve_port}/"),
                     work)
        procs.append(proxy)
        cluster.wait_for("oauth2-proxy ready", lambda: cluster.http_get(base + "/ping", timeout=2)[0] == 200, 30)

        # Alice, in engineering: the Shiny app and the API see her; admin refuses her.
        queue_user(provider["control"], "alice", "alice@example.com", ["engineering", "r users"])
        alice = sign_in(base)
        result["alice"] = alice
        check("alice signed in", alice.get("signed_in") is True and "error" not in alice, alice)
        check("alice's Shiny page", alice.get("shiny_status") == 200, alice.get("shiny_status"))
        check("session$user is alice, not the forged mallory", alice.get("shiny_user") == "alice",
              alice.get("shiny_user"))
        check("session$groups", alice.get("shiny_groups") == "engineering,r users", alice.get("shiny_groups"))
        api = alice.get("api") or {}
        check("plumber's X-Forwarded-User", api.get("user") == "alice", api)
        check("plumber's X-Forwarded-Email", api.get("email") == "alice@example.com", api)
        check("plumber's X-Forwarded-Groups", api.get("groups") == "engineering,r users", api)
        check("no forged Shiny-Server-Credentials reaches plumber", "mallory" not in json.dumps(api), api)
        check("admin refuses alice with 403", alice.get("admin_status") == 403, alice.get("admin_status"))

        # Bob, in sales only: the Shiny app (engineering) refuses him; the API serves him.
        queue_user(provider["control"], "bob", "bob@example.com", ["sales"])
        bob = sign_in(base)
        result["bob"] = bob
        check("bob signed in", bob.get("signed_in") is True and "error" not in bob, bob)
        check("the Shiny app refuses bob (not in engineering) with 403", bob.get("shiny_status") == 403,
              bob.get("shiny_status"))
        check("the API sees bob", (bob.get("api") or {}).get("user") == "bob", bob.get("api"))

        # Straight to valve from 127.0.0.2 (not trusted), naming itself someone.
        forged = {
            "X-Forwarded-User": "root@example.com", "X-Forwarded-Email": "root@example.com",
            "X-Forwarded-Groups": "engineering", "X-Forwarded-For": "203.0.113.9",
            "Shiny-Server-Credentials": json.dumps({"user": "root@example.com", "groups": ["engineering"]}),
        }
        status, body = straight(valve_port, "/api/whoami", forged)
        seen = json.loads(body) if status == 200 else body
        result["untrusted_api"] = seen
        check("an untrusted client's API call is served", status == 200, (status, body))
        if status == 200:
            check("its identity headers never reach R",
                  (seen["user"], seen["email"], seen["groups"], seen["credentials"]) == ("", "", "", ""), seen)
            check("its X-Forwarded-For is not believed", seen["remote_addr"] == "127.0.0.2", seen)
        for path in ["/shiny/", "/admin/whoami"]:
            status, body = straight(valve_port, path, forged)
            result[f"untrusted {path}"] = status
            check(f"an untrusted client naming itself root gets 403 for {path}", status == 403, (status, body[:200]))

        forward_auth(binary, work, provider, procs, check, result)
    except Exception as e:  # noqa: BLE001: reported below
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        for p in reversed(procs):
            p.stop()
    result["seconds"] = round(time.monotonic() - started, 1)
    result["problems"] = problems
    print(json.dumps(result))
    if problems:
        for p in procs:
            print(f"--- {p.name} log tail ---\n{p.tail()}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
