#!/usr/bin/env bash
# The Prometheus Operator rules (k8s/monitoring): rendered with kustomize, their groups
# checked and unit-tested by Debian's promtool (in the forkyard/prometheus image that
# `scripts/images.sh` builds), so an alert that would never fire, or fire on nothing,
# fails here. Needs: Docker, the image, kubectl and python3 with PyYAML (the tools venv).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${TOOLS_VENV:-$HOME/.cache/forkyard/venv}/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kubectl kustomize k8s/monitoring | python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
kinds = sorted(d["kind"] for d in docs)
assert kinds == ["PrometheusRule", "ServiceMonitor"], kinds
rule = next(d for d in docs if d["kind"] == "PrometheusRule")
yaml.safe_dump({"groups": rule["spec"]["groups"]}, open(sys.argv[1], "w"))
' "$work/rules.yml"
cp k8s/monitoring/tests/alerts_test.yml "$work/"
chmod -R a+rX "$work"
run() { docker run --rm --network none -v "$work:/rules:ro" -w /rules --entrypoint /usr/bin/promtool "forkyard/prometheus:${FORKYARD_PROMETHEUS_TAG:-local}" "$@"; }
run check rules rules.yml
run test rules alerts_test.yml
echo "check-alerts: rules valid, alert tests passed"
