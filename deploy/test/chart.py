#!/usr/bin/env python3
"""Validates the Helm chart and the plain manifests, strictly and offline.

- `helm lint --strict` on the defaults and on every values set below (the chart's
  values.schema.json rejects unknown keys);
- `helm template --kube-version V ... | kubernetes-validate --strict -k V` for each
  set and each of the oldest and newest Kubernetes versions checked here
  (misspelled fields fail);
  custom resources (KEDA's ScaledObject) have no bundled schema: skipped, with a note;
- what the manifests must say: probes on valve's paths on the main port, the
  drain flags, a grace period covering them, --config only with a config, each
  `isolation` value's security context (non-root and no capabilities; root with
  exactly the capabilities valve needs to switch users, a state volume; those
  plus SYS_ADMIN and AppArmor unconfined, seccomp as asked), ...;
- a misspelled value and a misspelled field are rejected (the checks bite);
- deploy/kubernetes/ is what the chart renders now, and validates too.

Run with a Python that has PyYAML (kubernetes-validate's venv has it):
    chart.py HELM KUBERNETES_VALIDATE
Prints `chart: ok (...)` or `chart: FAILED: ...` lines; exits 0 or 1.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.dirname(HERE)
CHART = os.path.join(DEPLOY, "helm", "valve")
KUBE_VERSIONS = ["1.27.0", "1.37.0"]
CUSTOM_API_GROUPS = ("keda.sh/",)

HELM, VALIDATE = sys.argv[1], sys.argv[2]
failures = []
notes = []


def fail(msg):
    failures.append(msg)
    print(f"chart: FAILED: {msg}")


def run(cmd, stdin=None):
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True)


CONFIG_TOML = """max_workers = 8

[[app]]
name = "sales"
path = "/sales"
file = "/app/sales/plumber.R"
n_max = 4

[[app]]
name = "explorer"
path = "/explorer"
file = "/app/explorer"
n_min = 0
"""

EXTRAS = """
serviceAccount: {create: true}
extraEnv: [{name: VALVE_MAX_REQUESTS, value: "1000"}]
podAnnotations: {example.com/team: data}
podLabels: {team: data}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: r, effect: NoSchedule}]
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector: {matchLabels: {app.kubernetes.io/name: valve}}
podDisruptionBudget: {enabled: false}
service: {type: LoadBalancer, annotations: {example.com/lb: internal}}
terminationGracePeriodSeconds: 120
valve: {file: /app/api, extraArgs: ["--max-requests", "1000"], logFormat: text}
"""

# name -> helm arguments
SETS = {
    "defaults": [],
    "shiny+ingress": ["--set", "shiny=true", "--set", "ingress.enabled=true", "--set", "ingress.className=nginx",
                      "--set", "ingress.tls[0].secretName=valve-tls",
                      "--set", "ingress.tls[0].hosts[0]=valve.example.com"],
    "hpa": ["--set", "autoscaling.hpa.enabled=true", "--set", "autoscaling.app=sales"],
    "keda": ["--set", "keda.enabled=true"],
    "config": ["--set-file", "config=CONFIG"],
    "extras": ["-f", "EXTRAS"],
    "admin-off": ["--set", "admin.enabled=false"],
    "signin": ["--set", "oauth2Proxy.enabled=true", "--set", "oauth2Proxy.oidcIssuerUrl=https://idp.example.com",
               "--set", "oauth2Proxy.existingSecret=valve-signin", "--set", "valve.trustedProxies[0]=10.0.0.0/8"],
    # With a sidecar: it must stay non-root whatever valve's container becomes.
    "isolation=users": ["--set", "isolation=users", "--set-file", "config=CONFIG", "--set", "oauth2Proxy.enabled=true",
                        "--set", "oauth2Proxy.oidcIssuerUrl=https://idp.example.com",
                        "--set", "oauth2Proxy.existingSecret=valve-signin"],
    "publishing": ["--set", "publishing.enabled=true", "--set", "publishing.keysSecret=valve-keys",
                   "--set", "isolation=users"],
    "isolation=view": ["--set", "isolation=view"],
    "isolation=shared": ["--set", "isolation=shared"],
    "isolation=view-unconfined": ["--set", "isolation=view", "--set", "viewSeccompProfile=Unconfined"],
}

# What valve needs as root to give each app a user of its own (found by trying, deploy/test/image).
USERS_CAPS = ["SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL"]


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    return found[0] if found else None


def validate(docs, what, versions=KUBE_VERSIONS):
    """kubernetes-validate --strict on the built-in kinds of `docs`."""
    builtin = [d for d in docs if not d["apiVersion"].startswith(CUSTOM_API_GROUPS)]
    for d in docs:
        if d not in builtin:
            notes.append(f"{what}: {d['kind']} ({d['apiVersion']}) skipped, a custom resource with no bundled schema")
    text = yaml.safe_dump_all(builtin)
    for version in versions:
        r = run([VALIDATE, "--strict", "--quiet", "-k", version, "-"], text)
        if r.returncode != 0:
            fail(f"{what}: kubernetes-validate --strict -k {version}:\n{r.stdout}{r.stderr}")
    return len(builtin)


def container(docs):
    return find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def check_defaults(docs):
    dep = find(docs, "Deployment")
    c = container(docs)
    pod = dep["spec"]["template"]["spec"]
    probes = {k: (c[k]["httpGet"]["path"], c[k]["httpGet"]["port"])
              for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    want = {"startupProbe": ("/__valve__/readyz", "http"), "readinessProbe": ("/__valve__/readyz", "http"),
            "livenessProbe": ("/__valve__/healthz", "http")}
    if probes != want:
        fail(f"probes {probes}, want {want}")
    args = c["args"]
    for a in ("--drain-delay=10", "--graceful-timeout=30", "--admin-addr=0.0.0.0:9090"):
        if a not in args:
            fail(f"the container's args lack {a}: {args}")
    if any(a.startswith("--config") for a in args):
        fail("--config without a config")
    if pod["terminationGracePeriodSeconds"] < 10 + 30 + 3:
        fail(f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} < drain delay + graceful timeout + 3")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    if ports != {"http": 3000, "admin": 9090}:
        fail(f"container ports {ports}")
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    if ann.get("prometheus.io/port") != "9090" or ann.get("prometheus.io/path") != "/__valve__/metrics":
        fail(f"scrape annotations {ann}")
    if not pod["securityContext"].get("runAsNonRoot") or not c["securityContext"].get("readOnlyRootFilesystem"):
        fail("the pod must run as non-root with a read-only root filesystem")
    if not any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]):
        fail("no writable /tmp for valve's run directory")
    svc = find(docs, "Service")
    if svc["spec"]["ports"][0]["targetPort"] != "http" or svc["spec"]["sessionAffinity"] != "None":
        fail(f"service {svc['spec']}")
    if not find(docs, "PodDisruptionBudget"):
        fail("no PodDisruptionBudget")
    if find(docs, "HorizontalPodAutoscaler") or find(docs, "Ingress") or find(docs, "ConfigMap"):
        fail("optional objects rendered by default")
    if dep["spec"].get("replicas") != 2:
        fail("replicas should be set without autoscaling")


def check_isolation(name, by_version):
    """Each `isolation` value's security contexts, volumes and state directory."""
    mode = name.split("=")[1].split("-")[0] if name.startswith("isolation=") else "landlock"
    docs = by_version[KUBE_VERSIONS[-1]]
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    c = container(docs)
    sc = c["securityContext"]
    caps = sc.get("capabilities", {})
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    what = f"isolation {mode}"
    if caps.get("drop") != ["ALL"]:
        fail(f"{what}: valve's container must drop every capability first: {caps}")
    if not sc.get("readOnlyRootFilesystem") or sc.get("allowPrivilegeEscalation") is not False:
        fail(f"{what}: valve's container must keep a read-only root and no privilege escalation: {sc}")
    if not pod["securityContext"].get("runAsNonRoot") or pod["securityContext"].get("runAsUser") != 10001:
        fail(f"{what}: the pod (and any sidecar) must stay non-root: {pod['securityContext']}")
    if mode in ("landlock", "shared"):
        if "add" in caps or "runAsUser" in sc:
            fail(f"{what}: valve's container must run as the pod's non-root user with no capability added: {sc}")
        if mode == "shared" and ("state" in volumes or "VALVE_STATE_DIR" in env or env.get("VALVE_ISOLATION") != "none"):
            fail(f"{what}: no state directory, and Landlock off (VALVE_ISOLATION=none): env {env}")
        if mode == "landlock" and ("VALVE_ISOLATION" in env or env.get("VALVE_STATE_DIR") != "/var/lib/valve"
                                   or mounts.get("state") != "/var/lib/valve" or "emptyDir" not in volumes.get("state", {})):
            fail(f"{what}: Landlock as valve decides (no VALVE_ISOLATION) and a writable state directory for the "
                 f"apps' homes (--state-dir on an emptyDir): env {env}, mounts {mounts}")
        return
    if (sc.get("runAsUser"), sc.get("runAsGroup"), sc.get("runAsNonRoot")) != (0, 0, False):
        fail(f"{what}: valve's container must run as root (runAsUser 0, runAsNonRoot false): {sc}")
    want = USERS_CAPS + (["SYS_ADMIN"] if mode == "view" else [])
    if caps.get("add") != want:
        fail(f"{what}: capabilities added {caps.get('add')}, want exactly {want}")
    if env.get("VALVE_STATE_DIR") != "/var/lib/valve" or mounts.get("state") != "/var/lib/valve" \
            or "emptyDir" not in volumes.get("state", {}):
        fail(f"{what}: no writable state directory (--state-dir on an emptyDir): env {env}, mounts {mounts}")
    unconfined = {"type": "Unconfined"}
    annotation = "container.apparmor.security.beta.kubernetes.io/valve"
    if mode == "users":
        if volumes.get("config", {}).get("configMap", {}).get("defaultMode") != 0o400:
            fail(f"{what}: valve's config file must be readable by valve (root) alone: {volumes.get('config')}")
        if "seccompProfile" in sc or "appArmorProfile" in sc:
            fail(f"{what}: valve's container keeps the runtime's seccomp and AppArmor profiles: {sc}")
        for side in pod["containers"][1:]:
            side_sc = side["securityContext"]
            if side_sc.get("runAsUser") == 0 or side_sc.get("capabilities", {}).get("add"):
                fail(f"{what}: the {side['name']} sidecar must stay non-root with no capability: {side_sc}")
    else:
        if sc.get("appArmorProfile") != unconfined:
            fail(f"{what}: Kubernetes {KUBE_VERSIONS[-1]}: AppArmor must be Unconfined: {sc}")
        # The pod's RuntimeDefault, unless asked for Unconfined.
        seccomp = unconfined if name.endswith("-unconfined") else None
        if sc.get("seccompProfile") != seccomp or pod["securityContext"].get("seccompProfile") != {"type": "RuntimeDefault"}:
            fail(f"{what} ({name}): seccomp {sc.get('seccompProfile')} in valve's container, want {seccomp}: {sc}")
        old = by_version[KUBE_VERSIONS[0]]
        old_ann = find(old, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        if old_ann.get(annotation) != "unconfined" or "appArmorProfile" in container(old)["securityContext"]:
            fail(f"{what}: Kubernetes {KUBE_VERSIONS[0]} takes AppArmor as the pod annotation {annotation}")


def check_set(name, docs):
    if name == "defaults":
        check_defaults(docs)
    elif name == "shiny+ingress":
        ann = find(docs, "Ingress")["metadata"]["annotations"]
        if ann.get("nginx.ingress.kubernetes.io/affinity") != "cookie":
            fail(f"Shiny ingress without cookie affinity: {ann}")
        if ann.get("nginx.ingress.kubernetes.io/session-cookie-name") in (None, "valve_worker"):
            fail("the balancer's affinity cookie must be its own, not valve_worker")
        if find(docs, "Service")["spec"]["sessionAffinity"] != "ClientIP":
            fail("a Shiny app's Service should keep ClientIP affinity")
    elif name == "hpa":
        hpa = find(docs, "HorizontalPodAutoscaler")
        m = hpa["spec"]["metrics"][0]["pods"]
        if (hpa["apiVersion"] != "autoscaling/v2" or m["metric"]["name"] != "valve_saturation"
                or m["target"] != {"type": "AverageValue", "averageValue": "0.7"}
                or m["metric"]["selector"]["matchLabels"] != {"app": "sales"}):
            fail(f"HPA {hpa['spec']}")
        if "replicas" in find(docs, "Deployment")["spec"]:
            fail("with an HPA the Deployment must not set replicas")
    elif name == "keda":
        so = find(docs, "ScaledObject")
        t = so["spec"]["triggers"][0]
        if t["type"] != "prometheus" or "valve_saturation" not in t["metadata"]["query"] or t["metadata"]["threshold"] != "0.7":
            fail(f"ScaledObject trigger {t}")
        if find(docs, "HorizontalPodAutoscaler"):
            fail("KEDA makes its own HPA: the chart must not render one too")
    elif name == "config":
        cm = find(docs, "ConfigMap")
        if not cm or cm["data"].get("valve.toml") != CONFIG_TOML:
            fail(f"ConfigMap {cm}")
        c = container(docs)
        if "--config=/etc/valve/valve.toml" not in c["args"]:
            fail(f"--config missing: {c['args']}")
        if not any(m["mountPath"] == "/etc/valve" for m in c["volumeMounts"]):
            fail("the config is not mounted at /etc/valve")
        if "checksum/config" not in find(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]:
            fail("a config change must roll the pods (checksum annotation)")
    elif name == "admin-off":
        c = container(docs)
        ann = find(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        if any(a.startswith("--admin-addr") for a in c["args"]) or [p["name"] for p in c["ports"]] != ["http"]:
            fail(f"admin.enabled=false still runs an admin listener: {c['args']} {c['ports']}")
        if ann.get("prometheus.io/port") != "3000":
            fail(f"admin.enabled=false: Prometheus must scrape the main port, not {ann.get('prometheus.io/port')}")
    elif name == "signin":
        pod = find(docs, "Deployment")["spec"]["template"]["spec"]
        names = [c["name"] for c in pod["containers"]]
        if names != ["valve", "oauth2-proxy"]:
            fail(f"oauth2Proxy.enabled: containers {names}")
        else:
            side = pod["containers"][1]
            if "--upstream=http://127.0.0.1:3000/" not in side["args"]:
                fail(f"the sidecar must send to valve over the pod's loopback: {side['args']}")
            if side["envFrom"] != [{"secretRef": {"name": "valve-signin"}}]:
                fail(f"the sidecar's secret: {side.get('envFrom')}")
        if "--trusted-proxies=10.0.0.0/8,127.0.0.1/32" not in container(docs)["args"]:
            fail(f"valve must trust the sidecar (and the listed proxies): {container(docs)['args']}")
        if find(docs, "Service")["spec"]["ports"][0]["targetPort"] != "signin":
            fail("with a sign-in sidecar the Service must send traffic to it, not to valve")
        r = run([HELM, "template", "valve", CHART, "--set", "oauth2Proxy.enabled=true",
                 "--set", "oauth2Proxy.oidcIssuerUrl=https://idp.example.com"])
        if r.returncode == 0 or "oauth2Proxy.existingSecret" not in r.stderr:
            fail(f"a sidecar without its Secret must not render: {r.stderr}")
    elif name == "publishing":
        c = container(docs)
        want = ["--publish-dir=/var/lib/valve-site/published", "--publish-keys-file=/etc/valve-keys/keys",
                "--publish-addr=0.0.0.0:3939", "--package-cache=/var/lib/valve-site/packages",
                "--usage-log=/var/lib/valve-site/usage/"]
        if [a for a in want if a not in c["args"]]:
            fail(f"publishing: valve's args lack {[a for a in want if a not in c['args']]}: {c['args']}")
        pvc = find(docs, "PersistentVolumeClaim")
        if not pvc or pvc["spec"]["accessModes"] != ["ReadWriteMany"]:
            fail(f"publishing with 2 replicas: one ReadWriteMany claim every pod mounts, not {pvc and pvc['spec']}")
        pod = find(docs, "Deployment")["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        if volumes.get("site", {}).get("persistentVolumeClaim", {}).get("claimName") != pvc["metadata"]["name"]:
            fail(f"the pods must mount the site's claim: {volumes.get('site')}")
        if volumes.get("publish-keys", {}).get("secret", {}).get("defaultMode") != 0o400:
            fail(f"the keys file must be readable by valve alone: {volumes.get('publish-keys')}")
        ports = {p["name"]: p for p in find(docs, "Service")["spec"]["ports"]}
        if ports.get("publish", {}).get("port") != 3939:
            fail(f"the publishing API must be reachable through the Service: {ports}")
        # Refused at install: several pods, a volume only one can mount; and no keys.
        for extra, says in [(["--set", "publishing.volume.accessMode=ReadWriteOnce"], "ReadWriteMany"),
                            (["--set", "publishing.volume.accessMode=ReadWriteOnce", "--set", "autoscaling.hpa.enabled=true",
                              "--set", "autoscaling.app=sales"], "autoscaling"),
                            (["--set", "publishing.keysSecret="], "publishing.keysSecret")]:
            r = run([HELM, "template", "valve", CHART, *SETS["publishing"], *extra])
            if r.returncode == 0 or says not in r.stderr:
                fail(f"publishing {extra} must be refused naming {says}: {r.stderr}")
        one = ["--set", "publishing.volume.accessMode=ReadWriteOnce", "--set", "replicaCount=1"]
        if run([HELM, "template", "valve", CHART, *SETS["publishing"], *one]).returncode != 0:
            fail("publishing with one replica and a ReadWriteOnce volume must render")
        claim = ["--set", "publishing.volume.accessMode=ReadWriteOnce", "--set", "publishing.volume.existingClaim=site"]
        r = run([HELM, "template", "valve", CHART, *SETS["publishing"], *claim])
        if r.returncode != 0 or "kind: PersistentVolumeClaim" in r.stdout:
            fail(f"an existing claim is used as it is, none made: {r.stderr}")
    elif name == "extras":
        if find(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] != 120:
            fail("terminationGracePeriodSeconds override ignored")
        if not find(docs, "ServiceAccount"):
            fail("serviceAccount.create ignored")


def main():
    tmp = tempfile.mkdtemp(prefix="valve-chart-")
    with open(os.path.join(tmp, "config.toml"), "w") as f:
        f.write(CONFIG_TOML)
    with open(os.path.join(tmp, "extras.yaml"), "w") as f:
        f.write(EXTRAS)
    subst = {"config=CONFIG": f"config={tmp}/config.toml", "EXTRAS": f"{tmp}/extras.yaml"}
    validated = 0
    for name, args in SETS.items():
        args = [subst.get(a, a) for a in args]
        r = run([HELM, "lint", "--strict", CHART, *args])
        if r.returncode != 0:
            fail(f"helm lint --strict ({name}):\n{r.stdout}{r.stderr}")
        by_version = {}
        for version in KUBE_VERSIONS:
            r = run([HELM, "template", "valve", CHART, "--namespace", "default", "--kube-version", version, *args])
            if r.returncode != 0:
                fail(f"helm template --kube-version {version} ({name}):\n{r.stderr}")
                break
            by_version[version] = docs_of(r.stdout)
            count = validate(by_version[version], name, [version])
        else:
            validated += count
            check_set(name, by_version[KUBE_VERSIONS[-1]])
            if name == "defaults" or name.startswith("isolation="):
                check_isolation(name, by_version)

    # The checks bite: a misspelled value, a misspelled field, both autoscalers at once.
    r = run([HELM, "lint", "--strict", CHART, "--set", "valve.drainDelai=5"])
    if r.returncode == 0:
        fail("helm lint accepted a misspelled value (valve.drainDelai)")
    r = run([HELM, "lint", "--strict", CHART, "--set", "isolation=root"])
    if r.returncode == 0:
        fail("helm lint accepted isolation=root (only landlock, shared, users, view)")
    r = run([HELM, "lint", "--strict", CHART, "--set", "viewSeccompProfile=Localhost"])
    if r.returncode == 0:
        fail("helm lint accepted viewSeccompProfile=Localhost (only RuntimeDefault, Unconfined)")
    r = run([HELM, "template", "valve", CHART, "--namespace", "default"])
    typo = r.stdout.replace("periodSeconds:", "periodSecond:", 1)
    if run([VALIDATE, "--strict", "--quiet", "-k", KUBE_VERSIONS[-1], "-"], typo).returncode == 0:
        fail("kubernetes-validate --strict accepted a misspelled field (periodSecond)")
    r = run([HELM, "template", "valve", CHART, "--set", "autoscaling.hpa.enabled=true", "--set", "keda.enabled=true"])
    if r.returncode == 0:
        fail("the chart rendered an HPA and a KEDA ScaledObject together")

    # deploy/kubernetes/ is the chart's rendering, and valid.
    out = os.path.join(tmp, "kubernetes")
    os.makedirs(out)
    r = run(["bash", os.path.join(DEPLOY, "kubernetes", "render"), out], None)
    if r.returncode != 0:
        fail(f"deploy/kubernetes/render:\n{r.stderr}")
    for fname in sorted(os.listdir(out)):
        mine = os.path.join(DEPLOY, "kubernetes", fname)
        fresh = open(os.path.join(out, fname)).read()
        if not os.path.exists(mine) or open(mine).read() != fresh:
            fail(f"deploy/kubernetes/{fname} differs from the chart's rendering: run deploy/kubernetes/render")
        validated += validate(docs_of(fresh), f"deploy/kubernetes/{fname}")

    shutil.rmtree(tmp, ignore_errors=True)
    for n in dict.fromkeys(notes):
        print(f"chart: note: {n}")
    if failures:
        sys.exit(1)
    print(f"chart: ok (helm lint --strict on {len(SETS)} value sets; {validated} objects valid under "
          f"kubernetes-validate --strict for Kubernetes {' and '.join(KUBE_VERSIONS)}; isolation landlock, shared, users, view; deploy/kubernetes/ up to date)")


if __name__ == "__main__":
    main()
