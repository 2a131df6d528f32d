#!/usr/bin/env bash
# A rolling upgrade with runs in flight: the replicated mesh starts on images of an
# earlier build (FROM_TAG, e.g. from `scripts/images-at.sh <commit> upgrade-from`), runs
# start on it (two waves each, so their workflows keep going on the new build), then
# every service is replaced by the current images (TO_TAG), one service after another:
# gateway (the workflow code), agent-runner, sandbox-provisioner, budget-ledger,
# janitor; each replaced replica drains on SIGTERM. Every run must finish with every
# fork succeeded and the ledger exact; a run started after the upgrade too.
set -euo pipefail
cd "$(dirname "$0")/../.."
project=forkyard-upgrade
FROM_TAG=${FROM_TAG:?FROM_TAG: the image tag of the earlier build}
TO_TAG=${TO_TAG:-local}
export FORKYARD_IMAGE_TAG=$FROM_TAG
source tests/containers/lib.sh
start_stack

ledger() { grpc "$(ip_of "$(containers budget-ledger | head -1)"):50054" "$@"; }
finished_well() { # run id → "state succeeded/forks cost spent reserved"
  local run=$1 state
  state=$(wait_terminal "$run" 300) || true
  local s; s=$(gw forkyard.gateway.v1.Gateway/GetRun "{\"run_id\":\"$run\"}" |
    json '"%s/%s %s" % (d.get("forksSucceeded",0), len(d.get("forks",[])), d.get("costMicros","0"))')
  local a; a=$(ledger forkyard.budget.v1.BudgetLedger/GetAccount "{\"account_id\":\"$run\"}" |
    json '"%s %s" % (d.get("spentMicros","0"), d.get("reservedMicros","0"))')
  echo "$state $s $a"
}

runs=("$(launch 4 2 'bash agent.sh 20')" "$(launch 6 3 'bash agent.sh 8')")
sleep 5
for s in gateway agent-runner sandbox-provisioner budget-ledger janitor; do
  started=$SECONDS
  FORKYARD_IMAGE_TAG=$TO_TAG "${C[@]}" up -d --no-deps "$s" >/dev/null 2>&1
  wait_serving
  images=$(for c in $(containers "$s"); do docker inspect -f '{{.Config.Image}}' "$c"; done | sort -u | tr '\n' ' ')
  check "$s replaced in $((SECONDS - started))s: $images" test "$images" = "forkyard/$s:$TO_TAG "
done
runs+=("$(launch 3 3 'bash agent.sh 1')")
for run in "${runs[@]}"; do
  read -r state ok cost spent reserved <<<"$(finished_well "$run")"
  check "run $run across the upgrade: $state, $ok succeeded, cost $cost, ledger spent $spent reserved $reserved" \
    test "$state" = RUN_STATE_COMPLETED -a "${ok%/*}" = "${ok#*/}" -a "$cost" = "$spent" -a "$reserved" = 0
done

echo
if [ "$failures" -gt 0 ]; then echo "test-upgrade: $failures failed"; exit 1; fi
echo "test-upgrade: all passed"
