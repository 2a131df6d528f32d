#!/usr/bin/env bash
# Container chaos: with a run in flight, `docker kill` (SIGKILL) one replica of the
# provisioner (one holding the run's sandboxes), the agent runner, the gateway, the
# ledger, the ledger's PostgreSQL (every ledger replica's one connection target, down
# for 60 s: agents go on unmetered, settlements wait for it) and the Temporal server
# (down for 30 s); every provisioner replica at once (down for 60 s); a gateway while
# forks are being finished; a replica of each service at
# a random moment of the run; then `docker stop` (SIGTERM, then a drain) one replica of
# each of the five services, which must exit 0; then start it again.
# After each trial:
#   - the run completes within 240 s with every fork succeeded (forks whose sandbox died
#     with its provisioner start again on a new one);
#   - the ledger is exact: the run's account spent = the run's cost = the sum of its
#     reservations' commits, nothing reserved, no reservation still HELD;
#   - after one janitor sweep: no sandbox on any replica, no workspace on any replica's
#     disk, no process in any provisioner container but the provisioner's own.
# Prints a table of trials and outcomes. `make test-containers` runs it after replicas.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
project=forkyard-chaos
source tests/containers/lib.sh
start_stack

holding() { grpc "$(ip_of "$1"):50052" forkyard.sandbox.v1.SandboxProvisioner/ListSandboxes '{}' | json 'len(d.get("sandboxes",[]))'; }
ledger() { grpc "$(ip_of "$(containers budget-ledger | head -1)"):50054" "$@"; }

rows=()
# action:service[@moment]. Without a moment the kill comes 2 s into the run (agents at
# work); @random: at a random moment of the run (0-5.9 s after the launch, the wave's
# preparation included); @finish: once the first fork has finished and the others are
# being finished (patch collected, spend committed, sandbox destroyed), the window a
# gateway crash once stalled for 12 minutes.
trials="kill:sandbox-provisioner kill:agent-runner kill:gateway kill:budget-ledger kill:ledger-postgres kill:temporal
  down:sandbox-provisioner kill:gateway@finish kill:gateway@random kill:sandbox-provisioner@random kill:agent-runner@random
  kill:budget-ledger@random kill:janitor@random
  term:sandbox-provisioner term:agent-runner term:gateway term:budget-ledger term:janitor"
for trial in $trials; do
  moment=""; [[ $trial == *@* ]] && moment=${trial#*@} && trial=${trial%@*}
  action=${trial%%:*} service=${trial#*:}
  # @finish: the forks' agents end one by one (2, 4, ... 12 s), so a kill once the
  # first has finished lands while others are being finished.
  agent='bash agent.sh 4'; [ "$moment" = finish ] && agent='bash agent.sh $((2 * FORKYARD_FORK))'
  run=$(launch 6 6 "$agent")
  at="2 s in"
  case $moment in
    # Within the run's life (its agents take 4 s).
    random) delay="$((RANDOM % 6)).$((RANDOM % 10))"; at="$delay s in"; sleep "$delay" ;;
    finish)
      deadline=$((SECONDS + 60))
      until [ "$(gw forkyard.gateway.v1.Gateway/GetRun "{\"run_id\":\"$run\"}" | json 'd.get("forksSucceeded",0)')" -ge 1 ]; do
        [ $SECONDS -lt $deadline ] || break; sleep 0.2
      done
      at="first fork finished" ;;
    *) sleep 2 ;;
  esac
  victim=""
  case $service in
    sandbox-provisioner)
      for c in $(containers sandbox-provisioner); do [ "$(holding "$c")" -gt 0 ] && victim=$c && break; done
      # At a random moment none may hold one yet (the wave is being prepared).
      [ -n "$victim" ] || [ "$moment" != random ] || victim=$(containers sandbox-provisioner | head -1) ;;
    *) victim=$(containers "$service" | head -1) ;;
  esac
  [ -n "$victim" ] || { fail "$service: no replica to $action"; continue; }
  exited=0
  if [ "$action" = down ]; then
    # Every replica away at once for 60 s: the wave and the forks wait, none is lost.
    victim=$(containers "$service" | tr '\n' ' ')
    docker kill $victim >/dev/null
  elif [ "$action" = term ]; then
    # SIGTERM: NOT_SERVING, drain (a provisioner waits for the sandboxes it holds), exit 0.
    docker stop -t 330 "$victim" >/dev/null
    exited=$(docker inspect -f '{{.State.ExitCode}}' "$victim")
  else
    docker kill "$victim" >/dev/null
  fi
  started=$SECONDS
  case $action:$service in
    # The one database: a 60 s outage (past the ledger calls' own retries), then back.
    kill:ledger-postgres) sleep 60; docker start "$victim" >/dev/null ;;
    # The Temporal server (its SQLite file survives): 30 s away, then back.
    kill:temporal) sleep 30; docker start "$victim" >/dev/null ;;
    down:*) sleep 60; docker start $victim >/dev/null ;;
  esac
  state=$(wait_terminal "$run" 240) || true
  took=$((SECONDS - started))
  docker start $victim >/dev/null
  wait_serving

  summary=$(gw forkyard.gateway.v1.Gateway/GetRun "{\"run_id\":\"$run\"}" |
    json '"%s %s %s" % (d.get("costMicros","0"), d.get("forksSucceeded",0), d.get("forksFailed",0))')
  read -r cost ok bad <<<"$summary"
  account=$(ledger forkyard.budget.v1.BudgetLedger/GetAccount "{\"account_id\":\"$run\"}")
  spent=$(echo "$account" | json 'd.get("spentMicros","0")')
  reserved=$(echo "$account" | json 'd.get("reservedMicros","0")')
  report=$(grpc "$(ip_of "$(containers janitor)"):50055" forkyard.janitor.v1.Janitor/SweepNow '{}')
  swept=$(echo "$report" | json 'sum(1 for a in d.get("actions",[]) if a.get("destroyed"))')
  reservations=$(ledger forkyard.budget.v1.BudgetLedger/ListReservations "{\"account_id\":\"$run\"}")
  held=$(echo "$reservations" | json 'sum(1 for r in d.get("reservations",[]) if r.get("state")=="RESERVATION_STATE_HELD")')
  committed=$(echo "$reservations" | json 'sum(int(r.get("committedMicros","0")) for r in d.get("reservations",[]))')
  left=0; workspaces=0; procs=0
  for c in $(containers sandbox-provisioner); do
    left=$((left + $(holding "$c")))
    workspaces=$((workspaces + $(docker exec "$c" sh -c 'ls /var/lib/forkyard/sandboxes 2>/dev/null | wc -l')))
    # tini, the provisioner, and the ps itself.
    procs=$((procs + $(docker exec "$c" sh -c 'ps -e -o comm= | grep -cv -e "^tini$" -e "^sandbox-provisi" -e "^ps$" -e "^sh$" -e "^grep$" -e "^wc$"' || true)))
  done
  outcome="$state in ${took}s: $ok ok / $bad failed; cost $cost spent $spent committed $committed reserved $reserved held $held; swept $swept; left: $left sandboxes, $workspaces workspaces, $procs processes; exit $exited"
  who=$victim act=$action; [ "$action" = down ] && who="every $service replica, 60 s" act=kill
  rows+=("$(printf '%-14s %-44s %-20s %s' "docker $act" "$who" "$at" "$outcome")")
  check "$action $who ($at): $outcome" test "$state" = RUN_STATE_COMPLETED -a "$bad" = 0 -a "$spent" = "$cost" -a "$committed" = "$cost" \
    -a "$reserved" = 0 -a "$held" = 0 -a "$left" = 0 -a "$workspaces" = 0 -a "$procs" = 0 -a "$exited" = 0
done

echo
printf '%-14s %-44s %-20s %s\n' "trial" "replica" "when" "outcome"
printf '%s\n' "${rows[@]}"
echo
if [ "$failures" -gt 0 ]; then echo "test-containers chaos: $failures failed"; exit 1; fi
echo "test-containers chaos: all passed"
