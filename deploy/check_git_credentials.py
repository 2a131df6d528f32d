"""Where the git credentials go, in Compose and in a rendered overlay (used by
check_deploy.py): to the gateway and the sandbox provisioner only (they check, clone and
push; no other service, and no init container, holds a credential). Each of the two
gets `GITHUB_TOKEN` (optional) and the credentials file: `FORKYARD_GIT_CREDENTIALS`
naming a file in a directory mounted read-only, whole (a Kubernetes Secret volume or a
Compose bind), never the file alone (`subPath` or a single-file bind never shows an
update, and the file's reload without a restart is the point). In Kubernetes the Secret
is optional (a missing one mounts an empty directory, and the services start without
the file) and its files are readable by the pod's fsGroup and nobody else.

Each function returns the problems found, [] when there are none.
"""

from __future__ import annotations

HOLDERS = {"gateway", "sandbox-provisioner"}
SETTING = "FORKYARD_GIT_CREDENTIALS"
TOKEN = "GITHUB_TOKEN"
MOUNT = "/etc/forkyard/git-credentials"
FILE = f"{MOUNT}/git-credentials.toml"
SECRET = "forkyard-git-credentials"
TOKEN_SECRET = "forkyard-git"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")


def _pod(d: dict) -> dict:
    spec = d["spec"]
    if d["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def _secret_names(v: dict) -> set[str]:
    """The Secrets a volume shows (a secret volume, or a projected one's sources)."""
    names = {(v.get("secret") or {}).get("secretName")}
    for src in (v.get("projected") or {}).get("sources") or []:
        names.add((src.get("secret") or {}).get("name"))
    return names - {None}


def _container_refs(c: dict, cred_vols: set[str]) -> list[str]:
    """What of the credentials a container is given: settings, Secrets, mounts."""
    refs = []
    for e in c.get("env") or []:
        ref = ((e.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name")
        if e["name"] in (SETTING, TOKEN) or ref in (SECRET, TOKEN_SECRET):
            refs.append(f"env {e['name']}")
    for src in c.get("envFrom") or []:
        if (src.get("secretRef") or {}).get("name") in (SECRET, TOKEN_SECRET):
            refs.append(f"envFrom {src['secretRef']['name']}")
    refs += [f"mount {m['name']}" for m in c.get("volumeMounts") or [] if m["name"] in cred_vols]
    return refs


def _holder_problems(name: str, pod: dict, c: dict, cred_vols: set[str]) -> list[str]:
    """The credentials as the holder `name`'s container `c` must have them."""
    bad = []
    env = {e["name"]: e for e in c.get("env") or []}
    if env.get(SETTING, {}).get("value") != FILE:
        bad.append(f"{name}: {SETTING} is {env.get(SETTING, {}).get('value')!r}, not {FILE}")
    token = ((env.get(TOKEN, {}).get("valueFrom") or {}).get("secretKeyRef") or {})
    if token.get("name") != TOKEN_SECRET or token.get("optional") is not True:
        bad.append(f"{name}: {TOKEN} is not from the optional Secret {TOKEN_SECRET}")
    mounts = [m for m in c.get("volumeMounts") or [] if m["name"] in cred_vols]
    if [m.get("mountPath") for m in mounts] != [MOUNT]:
        return bad + [f"{name}: the credentials are mounted at {[m.get('mountPath') for m in mounts]}, not at {MOUNT} once"]
    m = mounts[0]
    if m.get("subPath") or m.get("subPathExpr"):
        bad.append(f"{name}: the credentials are mounted with a subPath (never updated)")
    if m.get("readOnly") is not True:
        bad.append(f"{name}: the credentials mount is not readOnly")
    vol = next(v for v in pod.get("volumes") or [] if v["name"] == m["name"])
    secret = vol.get("secret") or {}
    if secret.get("secretName") != SECRET or secret.get("optional") is not True:
        bad.append(f"{name}: the credentials volume is not the optional Secret {SECRET}")
    if secret.get("items"):
        bad.append(f"{name}: the credentials volume picks items (the file's key files would be missing)")
    mode = secret.get("defaultMode", 0o644)
    if mode & 0o137 or not mode & 0o040:
        bad.append(f"{name}: the credentials' mode {mode:o} is not 0440 (group read, no one else)")
    if not (pod.get("securityContext") or {}).get("fsGroup"):
        bad.append(f"{name}: no fsGroup, so the non-root user cannot read the credentials")
    return bad


def k8s_problems(docs: list[dict]) -> list[str]:
    """The credentials in a rendered overlay: on exactly the two holders' own containers."""
    bad = []
    holders = set()
    for d in (d for d in docs if d["kind"] in WORKLOADS):
        name, pod = d["metadata"]["name"], _pod(d)
        cred_vols = {v["name"] for v in pod.get("volumes") or []
                     if _secret_names(v) & {SECRET, TOKEN_SECRET}}
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            refs = _container_refs(c, cred_vols)
            if name in HOLDERS and c["name"] == name:
                holders.add(name)
                bad += _holder_problems(name, pod, c, cred_vols)
            elif refs:
                bad.append(f"{name}/{c['name']}: holds git credentials: {refs}")
    bad += [f"{h}: no Deployment holds the credentials" for h in sorted(HOLDERS - holders)]
    for cm in (d for d in docs if d["kind"] == "ConfigMap"):
        for k in set(cm.get("data") or {}) & {SETTING, TOKEN}:
            bad.append(f"ConfigMap {cm['metadata']['name']} sets {k} (every service would get it)")
    return bad


def compose_problems(config: dict) -> list[str]:
    """The credentials in `docker compose config`: on the two holders alone."""
    bad = []
    for name, svc in config["services"].items():
        env = svc.get("environment") or {}
        mounts = [v for v in svc.get("volumes") or [] if v.get("target", "").startswith(MOUNT)]
        if name not in HOLDERS:
            given = sorted(set(env) & {SETTING, TOKEN}) + [m["target"] for m in mounts]
            if given:
                bad.append(f"compose {name}: holds git credentials: {given}")
            continue
        if env.get(SETTING) != FILE:
            bad.append(f"compose {name}: {SETTING} is {env.get(SETTING)!r}, not {FILE}")
        if TOKEN not in env:
            bad.append(f"compose {name}: no {TOKEN}")
        if [(m.get("type"), m.get("target"), m.get("read_only")) for m in mounts] != [("bind", MOUNT, True)]:
            bad.append(f"compose {name}: the credentials are not one read-only bind of a directory at {MOUNT}: {mounts}")
    return bad
