#!/usr/bin/env bash
# A rolling upgrade with runs in flight: the replicated mesh starts on images of an
# earlier build (FROM_TAG, e.g. from `scripts/images-at.sh <commit> upgrade-from`), runs
# start on it (two waves each, so their workflows keep going on the new build), then
# every service is replaced by the current images (TO_TAG), one service after another:
# gateway (the workflow code), agent-runner, sandbox-provisioner, budget-ledger,
# janitor. Each service rolls the way the Kubernetes Deployments do (k8s/README.md,
# maxSurge 1, maxUnavailable 0): one replica of the new build is added and SERVING
# before one of the earlier build gets SIGTERM, drains and is removed, until none of
# the earlier build is left. (`docker-compose up` would replace every replica at once,
# leaving no provisioner that takes creates while all of them drain.) Runs started on the earlier build
# must still be in flight when each service is replaced and after it (so their
# workflows, agents, sandboxes and ledger calls go on across each replacement), and
# every run must finish with every fork succeeded and the ledger exactly what its
# agents reported; a run started after the upgrade too.
set -euo pipefail
cd "$(dirname "$0")/../.."
project=forkyard-upgrade
FROM_TAG=${FROM_TAG:?FROM_TAG: the image tag of the earlier build}
TO_TAG=${TO_TAG:-local}
export FORKYARD_IMAGE_TAG=$FROM_TAG
# The console is not part of the upgrade: the earlier build may have no console image.
export FORKYARD_CONSOLE_TAG=$TO_TAG
source tests/containers/lib.sh
start_stack

# A run that has not ended and still has a fork to finish.
in_flight() { get_run "$1" | json 'd.get("state") == "RUN_STATE_RUNNING" and d.get("forksRunning",0) + d.get("forksPending",0) > 0' | grep -x True >/dev/null; }
some_in_flight() { local r; for r in "$@"; do in_flight "$r" && return 0; done; return 1; }
progress() { # runs → "run: state, running/pending/done forks" for each
  local r
  for r in "$@"; do
    get_run "$r" | json '"%s %s %d running, %d pending, %d succeeded" % (d["runId"], d.get("state"), d.get("forksRunning",0), d.get("forksPending",0), d.get("forksSucceeded",0))'
  done | tr '\n' ';'
}

# The containers of a service that do not run the image of `tag`.
not_on() { local s=$1 tag=$2 c; for c in $(containers "$s"); do
  [ "$(docker inspect -f '{{.Config.Image}}' "$c")" = "forkyard/$s:$tag" ] || echo "$c"; done; }

# Replace every replica of a service by one of TO_TAG, one at a time: surge one (compose
# keeps the others, --no-recreate, and makes the new one from the new image), wait until
# every replica is SERVING, then stop one of the earlier build (SIGTERM: NOT_SERVING,
# drain; within the provisioner's 330 s grace) and remove it.
roll() {
  local s=$1 n old
  n=$(containers "$s" | wc -l)
  while old=$(not_on "$s" "$TO_TAG" | head -1); [ -n "$old" ]; do
    FORKYARD_IMAGE_TAG=$TO_TAG "${C[@]}" up -d --no-deps --no-recreate --scale "$s=$((n + 1))" "$s" >/dev/null 2>&1
    wait_serving || return 1
    docker stop -t 330 "$old" >/dev/null && docker rm "$old" >/dev/null
  done
}

# Forks of each run as launched: [forks, at once, agent seconds]. The first runs one
# 30 s fork after another at most two at a time, so it lasts past every replacement
# (the provisioner's replicas each drain the forks on their sandboxes first).
specs=("14 2 30" "6 3 8")
runs=()
for spec in "${specs[@]}"; do
  read -r forks at_once secs <<<"$spec"
  runs+=("$(launch "$forks" "$at_once" "bash agent.sh $secs")")
done
sleep 5
for s in gateway agent-runner sandbox-provisioner budget-ledger janitor; do
  check "runs in flight when $s is replaced ($(progress "${runs[@]}"))" some_in_flight "${runs[@]}"
  started=$SECONDS
  roll "$s" || fail "$s: rolling replacement"
  images=$(for c in $(containers "$s"); do docker inspect -f '{{.Config.Image}}' "$c"; done | sort -u | tr '\n' ' ')
  check "$s replaced in $((SECONDS - started))s: $images" test "$images" = "forkyard/$s:$TO_TAG "
  check "runs still in flight once $s is replaced ($(progress "${runs[@]}"))" some_in_flight "${runs[@]}"
done
runs+=("$(launch 3 3 'bash agent.sh 1')")
specs+=("3 3 1")
for i in "${!runs[@]}"; do
  run=${runs[$i]} forks=${specs[$i]%% *}
  state=$(wait_terminal "$run" 300) || true
  check "run $run across the upgrade ended ($state)" test "$state" = RUN_STATE_COMPLETED
  check_forks_succeeded "run $run across the upgrade" "$run" "$forks"
  check_ledger_exact "run $run across the upgrade, $forks agents' reports" "$run" $((forks * AGENT_REPORT_MICROS))
done

echo
if [ "$failures" -gt 0 ]; then echo "test-upgrade: $failures failed"; exit 1; fi
echo "test-upgrade: all passed"
