#!/usr/bin/env bash
# Container chaos: faults of the replicated mesh (deploy/compose.replicas.yml) with a run
# in flight, one trial after another on one stack.
#
#   kill:<service>[@moment]  `docker kill` (SIGKILL) of one replica: of the provisioner one
#                            holding the run's sandboxes; the ledger's PostgreSQL is down
#                            60 s, the Temporal server 30 s. Without a moment the kill
#                            comes 2 s into the run (agents at work); @random at a random
#                            moment of it (the wave's preparation included); @finish once
#                            the first fork has finished and the others are being finished.
#   down:sandbox-provisioner every provisioner replica killed at once, away for 60 s.
#   term:<service>           `docker stop` (SIGTERM, then a drain) of one replica, which
#                            must exit 0 within its grace period.
#   fault:<point>            the only gateway dies at a fault point of its own code
#                            (FORKYARD_FAULTS, debug builds: the images of PROFILE=debug)
#                            after a fork's patch, commit or destroy (#42 item 1), and is
#                            replaced by one without the fault.
#   drain:sandbox-provisioner SIGTERM of the only provisioner replica while one fork's
#                            agent has ended and the next wave is being made (#42 item 2).
#   losses:agent-runner      the only agent runner killed twice during one agent (item 3).
#   cancel:sandbox-provisioner a cancel while every provisioner is away for 30 s (item 4).
#
# After every trial:
#   - the run ended as the trial expects (COMPLETED, or CANCELLED after a cancel), and
#     every fork it expects to succeed did;
#   - the ledger holds exactly what the run's agents reported, a sum known before the run
#     (sandbox time is free in the test stack: tests/containers/compose.test.yml): spent,
#     committed by its reservations and the run's own cost all equal it, nothing reserved
#     or held;
#   - nothing is left on any provisioner replica: no sandbox listed, no workspace on its
#     volume (read on the host), no process in its container but its init and the
#     provisioner (read on the host: `docker top`, whatever the process is called) —
#     after one janitor sweep where the fault leaves sandboxes to it (a killed
#     provisioner's), without one where the run's own cleanup must do it. A killed
#     container takes its sandboxes' processes with it, so for those trials the
#     processes checked are the ones of the restarted replica and the others; what a
#     kill can leave is its workspaces and sandbox records, both checked.
#     (Sandboxes in containers get no cgroups of their own: FORKYARD_CGROUP_PARENT="".)
#
# CHAOS_SET=full (default; `make chaos`) runs every trial, CHAOS_SET=bounded (`make
# test-containers`, so `make test`) the bounded set below; CHAOS_TRIALS="<trial> ..."
# runs the ones named. Prints a table of trials, outcomes and the time each took.
set -euo pipefail
cd "$(dirname "$0")/../.."
project=forkyard-chaos

FULL_TRIALS="kill:sandbox-provisioner kill:agent-runner kill:gateway kill:budget-ledger kill:ledger-postgres kill:temporal
  down:sandbox-provisioner kill:gateway@finish kill:gateway@random kill:sandbox-provisioner@random kill:agent-runner@random
  kill:budget-ledger@random kill:janitor@random
  term:sandbox-provisioner term:agent-runner term:gateway term:budget-ledger term:janitor
  fault:finish.after-patch fault:finish.after-commit fault:finish.after-destroy
  drain:sandbox-provisioner losses:agent-runner cancel:sandbox-provisioner"
# One trial per #42 item (the finish fault whose old failure lost the patch and charged
# the fork twice), and the kills the other suites do not cover: a provisioner holding
# sandboxes, the gateway while forks finish, the ledger's database away.
BOUNDED_TRIALS="kill:sandbox-provisioner kill:gateway@finish kill:ledger-postgres
  fault:finish.after-destroy drain:sandbox-provisioner losses:agent-runner cancel:sandbox-provisioner"
case ${CHAOS_SET:-full} in
  full) trials=$FULL_TRIALS ;;
  bounded) trials=$BOUNDED_TRIALS ;;
  *) echo "chaos: CHAOS_SET is full or bounded, not ${CHAOS_SET}" >&2; exit 64 ;;
esac
trials=${CHAOS_TRIALS:-$trials}

source tests/containers/lib.sh
start_stack

# ---- what is left on the provisioner replicas --------------------------------------------

# The sandboxes a provisioner replica lists.
sandboxes_held() { grpc "$(ip_of "$1"):50052" forkyard.sandbox.v1.SandboxProvisioner/ListSandboxes '{}' | json 'len(d.get("sandboxes",[]))'; }
# The workspaces on a replica's volume, read on the host (also while it is down).
workspaces_on_disk() {
  local dir
  dir=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/var/lib/forkyard"}}{{.Source}}{{end}}{{end}}' "$1")
  [ -n "$dir" ] || { echo "no state volume on $1" >&2; echo 1; return; }
  find "$dir/sandboxes" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l
}
# The processes of a running provisioner container other than its init (tini) and the
# provisioner itself, one line each, as the host sees them: its sandboxes' processes
# (bubblewrap, init, the agents and everything they started), whatever they are called.
sandbox_processes() {
  local init
  [ "$(docker inspect -f '{{.State.Running}}' "$1")" = true ] || return 0
  init=$(docker inspect -f '{{.State.Pid}}' "$1")
  docker top "$1" -eo pid,ppid,args | awk -v init="$init" '
    NR == 1 || $1 == init { next }
    $2 == init && $3 == "/usr/local/bin/sandbox-provisioner" { next }
    { print }'
}
sandbox_process_count() { sandbox_processes "$1" | wc -l; }
# Every sandbox process of the replicas named, counted.
processes_on() { local c n=0; for c in "$@"; do n=$((n + $(sandbox_process_count "$c"))); done; echo "$n"; }

# Sets left, workspaces, procs (sums over the provisioner replicas) and leftovers (what
# they are, for the failure message).
take_stock() {
  local c p
  left=0 workspaces=0 procs=0 leftovers=""
  for c in $(containers sandbox-provisioner); do
    left=$((left + $(sandboxes_held "$c")))
    workspaces=$((workspaces + $(workspaces_on_disk "$c")))
    p=$(sandbox_processes "$c")
    [ -z "$p" ] || { procs=$((procs + $(echo "$p" | wc -l))); leftovers="$leftovers; $c: $(echo "$p" | head -5 | tr '\n' '|')"; }
  done
}
janitor_sweeps() { metric "$(ip_of "$(containers janitor)"):9455" janitor_sweeps_total; }
nothing_left_now() { take_stock; [ "$left" = 0 ] && [ "$workspaces" = 0 ] && [ "$procs" = 0 ]; }

# ---- the verdict every trial ends with ------------------------------------------------------

rows=()
# The run ended in `state` with `ok` forks succeeded (when that is every fork, each is
# checked), the ledger holds `micros` exactly, and nothing of the run is left: after one
# janitor sweep for `sweep`, without one for `no-sweep`.
verdict() { # run, state, forks, ok, micros, sweep|no-sweep
  local run=$1 want_state=$2 forks=$3 want_ok=$4 micros=$5 sweep=$6 state ok swept=-
  state=$(wait_terminal "$run" 240) || true
  took=$((SECONDS - fault_at))
  check "$label: run ended $want_state ($state, ${took}s after the fault)" test "$state" = "$want_state"
  # A run that never ended is cancelled, so the next trial starts on an idle mesh.
  case $state in *COMPLETED | *FAILED | *CANCELLED) ;; *)
    gw forkyard.gateway.v1.Gateway/CancelRun "{\"run_id\":\"$run\"}" >/dev/null || true
    wait_terminal "$run" 300 >/dev/null || true ;;
  esac
  ok=$(get_run "$run" | json 'd.get("forksSucceeded",0)')
  if [ "$want_ok" = "$forks" ]; then
    check_forks_succeeded "$label" "$run" "$forks"
  else
    check "$label: $want_ok of $forks forks succeeded ($ok)" test "$ok" = "$want_ok"
  fi
  check_ledger_exact "$label" "$run" "$micros"
  # What a sweep destroys, or the run's own cleanup (tried for up to five minutes:
  # finish::CLEANUP_DEADLINE), is gone within the wait; anything still there at its end
  # fails the check below.
  local limit=300 how=" without a janitor sweep"
  if [ "$sweep" = sweep ]; then
    swept=$(grpc "$(ip_of "$(containers janitor)"):50055" forkyard.janitor.v1.Janitor/SweepNow '{}' |
      json 'sum(1 for a in d.get("actions",[]) if a.get("destroyed"))')
    limit=30 how=" after one janitor sweep"
  fi
  local deadline=$((SECONDS + limit))
  until nothing_left_now || [ $SECONDS -ge $deadline ]; do sleep 1; done
  check "$label: nothing left$how ($left sandboxes, $workspaces workspaces, $procs processes${leftovers})" \
    test "$left" = 0 -a "$workspaces" = 0 -a "$procs" = 0
  # No sweep ran meanwhile (the stack has no cleanup schedule; this proves it), unless
  # the trial restarted the janitor, and its count with it.
  if [ "$sweep" = no-sweep ] && [[ $trial != *janitor* ]]; then
    check "$label: no janitor sweep ran during the trial (sweeps: $sweeps_before before, $(janitor_sweeps) after)" \
      test "$(janitor_sweeps)" = "$sweeps_before"
  fi
  rows+=("$(printf '%-30s %-38s %-24s %5ss  %s' "$label" "$who" "$at" "$((SECONDS - trial_started))" \
    "$state in ${took}s, $ok/$forks ok, ledger $micros µ\$; swept $swept; $notes")")
}

# ---- the trials -----------------------------------------------------------------------------

# kill|term|down:<service>[@moment]: six forks of agent.sh (4 s of work), every fork
# succeeds, $0.06 spent.
replica_trial() { # action, service, moment
  local action=$1 service=$2 moment=$3 agent='bash agent.sh 4' victim="" exited c
  # @finish: the agents end one by one (2, 4, ... 12 s), so a kill once the first has
  # finished lands while others are being finished. @random: the agents take 8 s, so a
  # kill in the first 6 s lands before any agent reports its cost (a provisioner killed
  # after a report would rightly charge the re-started fork's second run).
  case $moment in
    finish) agent='bash agent.sh $((2 * FORKYARD_FORK))' ;;
    random) agent='bash agent.sh 8' ;;
  esac
  run=$(launch 6 6 "$agent")
  at="2 s in"
  case $moment in
    random) local delay="$((RANDOM % 6)).$((RANDOM % 10))"; at="$delay s in"; sleep "$delay" ;;
    finish)
      wait_until 60 "$label: a fork finished, to kill the gateway while the others finish" \
        test_run_field "$run" 'd.get("forksSucceeded",0) >= 1' || true
      at="first fork finished" ;;
    *) sleep 2 ;;
  esac
  case $service in
    sandbox-provisioner)
      for c in $(containers sandbox-provisioner); do [ "$(sandboxes_held "$c")" -gt 0 ] && victim=$c && break; done
      # At a random moment none may hold one yet (the wave is being prepared).
      [ -n "$victim" ] || [ "$moment" != random ] || victim=$(containers sandbox-provisioner | head -1) ;;
    *) victim=$(containers "$service" | head -1) ;;
  esac
  [ -n "$victim" ] || { fail "$label: no $service replica to $action"; victim=none; }
  who=$victim
  [ "$action" = down ] && victim=$(containers "$service" | tr '\n' ' ') && who="every $service replica, 60 s"
  [ "$service" = sandbox-provisioner ] && notes="$(processes_on $victim) sandbox processes on it before; "
  fault_at=$SECONDS
  case $action in
    term)
      # SIGTERM: NOT_SERVING, drain (a provisioner waits for the sandboxes it holds), exit 0
      # within the replica's grace period (stop_grace_period: 330 s for a provisioner, 60 s
      # for the others), past which Docker kills it (exit 137).
      docker stop "$victim" >/dev/null
      exited=$(docker inspect -f '{{.State.ExitCode}}' "$victim")
      check "$label: $victim drained and exited 0 within its grace period (exit $exited after $((SECONDS - fault_at))s)" test "$exited" = 0 ;;
    *) [ "$victim" = none ] || docker kill $victim >/dev/null ;;
  esac
  case $action:$service in
    # The one database: a 60 s outage (past the ledger calls' own retries), then back.
    kill:ledger-postgres) sleep 60 ;;
    # The Temporal server (its SQLite file survives): 30 s away, then back.
    kill:temporal) sleep 30 ;;
    # Every replica away at once for 60 s: the wave and the forks wait, none is lost.
    down:*) sleep 60 ;;
  esac
  [ "$victim" = none ] || docker start $victim >/dev/null
  wait_serving
  # A killed provisioner's sandboxes are the janitor's.
  local sweep=no-sweep
  [ "$service" = sandbox-provisioner ] && [ "$action" != term ] && sweep=sweep
  verdict "$run" RUN_STATE_COMPLETED 6 6 $((6 * AGENT_REPORT_MICROS)) "$sweep"
}
test_run_field() { [ "$(get_run "$1" | json "$2")" = True ]; }

# fault:<point>: the gateway dies at a fault point of a fork's finish (after its patch,
# its commit or its destroy: services/gateway/src/activities/finish.rs), deterministically: the
# gateway replicas are stopped and one gateway runs with FORKYARD_FAULTS=<point>, so the
# first fork it finishes kills it there; then the replicas take the finish over (the
# activity's heartbeat timeout, 30 s, and a backoff). Every fork must succeed with its
# own patch, its agent charged once, the ledger exact. Before the retry returned what
# the first attempt reached, a kill after the destroy lost the patch (the fork ran again
# and was charged twice) and a kill after the commit was refused by the ledger (same
# key, another amount: the retry's second patch collection priced the sandbox's time
# again), failing the fork. In containers a sandbox has no cgroup of its own
# (FORKYARD_CGROUP_PARENT=""), so its time is not measured and costs nothing however it
# is priced: here the kill after the commit proves that the retry neither fails the fork
# nor charges it twice, not that a second collection would have cost more;
# tests/tests/e2e_finish_faults.rs proves that on the host, with sandbox time priced.
gateway_fault_trial() { # point
  local point=$1 armed=$project-gateway-at-fault replicas addr code
  replicas=$(containers gateway)
  docker stop $replicas >/dev/null
  "${C[@]}" run -d --no-deps --name "$armed" -e "FORKYARD_FAULTS=$point" gateway >/dev/null
  addr=$(ip_of "$armed"):50051
  wait_until 120 "$label: the gateway armed with $point serves" serves "$addr" || true
  run=$(grpc "$addr" forkyard.gateway.v1.Gateway/LaunchRun "$(launch_request 3 3 'bash agent.sh 1')" | json 'd["runId"]')
  who="$armed"; at="$point"
  wait_until 180 "$label: the gateway died at $point" container_exited "$armed" || true
  fault_at=$SECONDS
  code=$(docker inspect -f '{{.State.ExitCode}}' "$armed")
  check "$label: the gateway died at the fault point (exit $code; its log names $point)" died_at_fault_point "$armed" "$point"
  docker rm -f -v "$armed" >/dev/null
  docker start $replicas >/dev/null
  wait_serving
  # The forks' results are whole once the run has ended (the retried finish comes after
  # the heartbeat timeout): read before, they have no patch or cost yet.
  wait_terminal "$run" 240 >/dev/null || true
  check_each_fork_once "$run" 3
  verdict "$run" RUN_STATE_COMPLETED 3 3 $((3 * AGENT_REPORT_MICROS)) no-sweep
}
serves() { grpc "$1" grpc.health.v1.Health/Check 2>/dev/null | grep '"SERVING"' >/dev/null; }
container_exited() { [ "$(docker inspect -f '{{.State.Status}}' "$1")" = exited ]; }
died_at_fault_point() { # container, point
  [ "$(docker inspect -f '{{.State.ExitCode}}' "$1")" != 0 ] &&
    docker logs "$1" 2>&1 | grep 'injected fault' | grep "$2" >/dev/null
}

# Each fork kept its own patch and its agent's $0.01 once (it ran once), and its
# sandbox's time cost nothing (not measured in containers: see gateway_fault_trial).
check_each_fork_once() { # run, forks
  local run=$1 forks=$2 f agents=0 shares=0 patches=0 result
  for f in $(seq 1 "$forks"); do
    result=$(gw forkyard.gateway.v1.Gateway/GetForkResult "{\"run_id\":\"$run\",\"fork\":$f}")
    agents=$((agents + $(echo "$result" | json 'd.get("modelCostMicros","0")')))
    shares=$((shares + $(echo "$result" | json 'd.get("sandboxCostMicros","0")')))
    echo "$result" | json 'd.get("patch","")' | grep -x "+fork $f" >/dev/null && patches=$((patches + 1))
  done
  check "$label: each fork's agent charged once ($agents µ\$ for $forks reports of $AGENT_REPORT_MICROS)" \
    test "$agents" = $((forks * AGENT_REPORT_MICROS))
  check "$label: every fork kept its own patch ($patches of $forks)" test "$patches" = "$forks"
  check "$label: no sandbox time charged ($shares µ\$)" test "$shares" = 0
}

# drain:sandbox-provisioner: SIGTERM of the only provisioner replica (the others stopped
# for the trial) while fork 1's agent has ended and fork 3's wave is being made, fork 2
# still at work (tests/tests/e2e_drain.rs). The replica refuses the wave's creates and
# drains: once fork 2 is finished it exits 0, within its grace period (330 s); fork 3
# waits for its restart. Every fork succeeds. Before, the wave and the drain waited for
# each other for 197 s and fork 3 failed ("this replica is shutting down").
drain_trial() {
  local all victim others exited since
  all=$(containers sandbox-provisioner)
  victim=$(echo "$all" | head -1) others=$(echo "$all" | tail -n +2 | tr '\n' ' ')
  docker stop $others >/dev/null
  since=$(date +%s)
  run=$(launch 3 2 'bash agent.sh $([ "$FORKYARD_FORK" = 2 ] && echo 16 || echo 4)')
  wait_until 120 "$label: forks 1 and 2 running their agents" forks_in_phase_are "$run" "running agent" 2 || true
  who=$victim; at="forks 1, 2 at work"
  notes="$(processes_on "$victim") sandbox processes on it before; "
  fault_at=$SECONDS
  docker stop "$victim" >/dev/null
  exited=$(docker inspect -f '{{.State.ExitCode}}' "$victim")
  check "$label: the only provisioner drained and exited 0 within its grace period (exit $exited after $((SECONDS - fault_at))s)" test "$exited" = 0
  notes="${notes}drained in $((SECONDS - fault_at))s"
  docker start "$victim" >/dev/null
  wait_terminal "$run" 240 >/dev/null || true
  check "$label: a create of the wave met the draining replica (a gateway logged its refusal)" \
    gateway_logged_since "$since" "this replica is shutting down"
  docker start $others >/dev/null
  wait_serving
  verdict "$run" RUN_STATE_COMPLETED 3 3 $((3 * AGENT_REPORT_MICROS)) no-sweep
}
gateway_logged_since() { # unix time, text
  local c
  for c in $(containers gateway); do
    docker logs --since "$1" "$c" 2>&1 | grep -F "$2" >/dev/null && return 0
  done
  return 1
}

# losses:agent-runner: the only agent runner (the other stopped for the trial) killed
# twice while one fork's agent runs (tests/tests/e2e_runner_losses.rs). A lost worker
# is not the agent's failure: each loss costs the heartbeat timeout and a backoff, and
# the agent starts over in the same sandbox; the fork succeeds, its agent charged once.
# Before, two losses spent the agent's two attempts and failed the fork.
runner_losses_trial() {
  local all runner others secs frac pid seen=""
  all=$(containers agent-runner)
  runner=$(echo "$all" | head -1) others=$(echo "$all" | tail -n +2 | tr '\n' ' ')
  docker stop $others >/dev/null
  # A sleep no other process on the host has, to find the agent from the host; the
  # shell's own command line spells it differently (${s}), so only the sleep matches.
  secs=$((40 + RANDOM % 50)) frac=$(printf '%06d' $(((RANDOM * 32768 + RANDOM) % 1000000)))
  run=$(launch 1 1 "s=$secs; sleep \${s}.$frac; echo done > done.txt; printf '{\"total_cost_usd\": 0.01}\\n'" \
    '{"fork_timeout_secs": 600}')
  who=$runner; at="agent at work, twice"; notes=""
  for kill in 1 2; do
    pid=$(agent_started "sleep $secs.$frac" "$seen") || { fail "$label: no agent process (attempt $kill) within 180s"; break; }
    seen="$seen $pid"
    [ "$kill" = 1 ] && fault_at=$SECONDS
    docker kill "$runner" >/dev/null
    docker start "$runner" >/dev/null
    notes="${notes}kill $kill at $((SECONDS - fault_at))s (agent $pid); "
  done
  # The third attempt's agent: its sleep ended early, the trial is about the attempts.
  if pid=$(agent_started "sleep $secs.$frac" "$seen"); then
    kill "$pid"
    notes="${notes}third agent at $((SECONDS - fault_at))s"
  else
    fail "$label: no third agent within 180s after two losses"
  fi
  check "$label: two losses while the agent ran, a new agent each time (agent processes:$seen)" test "$(echo $seen | wc -w)" = 2
  docker start $others >/dev/null
  wait_serving
  verdict "$run" RUN_STATE_COMPLETED 1 1 "$AGENT_REPORT_MICROS" no-sweep
  check "$label: the fork's patch is its agent's" fork_patch_has "$run" 1 '^+done$'
}
# The host pid of a process whose command line is exactly `cmd`, other than those given;
# waits up to 180 s (each loss costs the heartbeat timeout and a backoff).
agent_started() { # cmd, pids already seen
  local deadline=$((SECONDS + 180)) p
  while [ $SECONDS -lt $deadline ]; do
    for p in $(pgrep -xf "$1" || true); do
      case " $2 " in *" $p "*) ;; *) echo "$p"; return 0 ;; esac
    done
    sleep 0.5
  done
  return 1
}
fork_patch_has() { # run, fork, pattern
  gw forkyard.gateway.v1.Gateway/GetForkResult "{\"run_id\":\"$1\",\"fork\":$2}" | json 'd.get("patch","")' | grep "$3" >/dev/null
}

# cancel:sandbox-provisioner: a run of three forks (sleep 300) is cancelled while every
# provisioner replica is away for 30 s (tests/tests/e2e_outage.rs). The run's destroys
# are tried until the replicas are back, so every sandbox goes without a janitor sweep,
# within the cleanup deadline (five minutes); no fork says it was left to the janitor.
# Before, the destroys gave up after about 6 s and the sandboxes stayed until a sweep.
cancel_in_outage_trial() {
  local all
  run=$(launch 3 3 'sleep 300')
  wait_until 120 "$label: three agents running" forks_in_phase_are "$run" "running agent" 3 || true
  all=$(containers sandbox-provisioner | tr '\n' ' ')
  who="every sandbox-provisioner, 30 s"; at="3 agents at work"
  notes="$(processes_on $all) sandbox processes before; "
  fault_at=$SECONDS
  docker kill $all >/dev/null
  gw forkyard.gateway.v1.Gateway/CancelRun "{\"run_id\":\"$run\"}" >/dev/null
  sleep 30
  docker start $all >/dev/null
  wait_serving
  verdict "$run" RUN_STATE_CANCELLED 3 0 0 no-sweep
  check "$label: no fork left its sandbox to the janitor" no_fork_says "$run" janitor
}
no_fork_says() { # run, text
  ! get_run "$1" | json '"\n".join(f.get("error","") for f in d.get("forks",[]))' | grep -i "$2" >/dev/null
}

for trial in $trials; do
  trial_started=$SECONDS fault_at=$SECONDS label=$trial notes="" who="" at="" run=""
  sweeps_before=$(janitor_sweeps)
  kind=${trial%%:*} target=${trial#*:}
  echo "---- $trial"
  case $kind in
    kill | term | down)
      moment=""; [[ $target == *@* ]] && moment=${target#*@} && target=${target%@*}
      replica_trial "$kind" "$target" "$moment" ;;
    fault) gateway_fault_trial "$target" ;;
    drain) drain_trial ;;
    losses) runner_losses_trial ;;
    cancel) cancel_in_outage_trial ;;
    *) fail "unknown trial $trial" ;;
  esac
done

echo
printf '%-30s %-38s %-24s %6s  %s\n' "trial" "replica" "when" "time" "outcome"
printf '%s\n' "${rows[@]}"
echo
if [ "$failures" -gt 0 ]; then echo "test-containers chaos: $failures failed"; exit 1; fi
echo "test-containers chaos: all passed"
