#!/usr/bin/env bash
# The mesh as replicated containers (deploy/compose.replicas.yml, locally built images):
# every replica serves; runs spread over the provisioner and runner replicas; any gateway
# replica answers for any run; GetForkResult returns the transcript whichever runner
# replica ran the fork, cancelled forks included; one janitor sweep reaches every
# provisioner replica; the ledger is exact; `docker stop` (SIGTERM) of a provisioner,
# runner or gateway replica mid-run drains it without failing a fork. Driven over gRPC
# (grpcurl).
#
# Needs: a Docker engine, the images (scripts/images.sh), docker compose and grpcurl
# (the tools venv). `make test-containers` provides all of it.
set -euo pipefail
cd "$(dirname "$0")/../.."
project=forkyard-ctest
source tests/containers/lib.sh
start_stack

# ---- Docker's own view: every replica's healthcheck passes, and fails when it cannot serve --
if wait_until 90 "every replica healthy by its Compose healthcheck ($(health_states))" all_healthy; then
  pass "every replica healthy by its Compose healthcheck ($(health_states))"
fi
janitor=$(containers janitor | head -1)
docker exec "$janitor" /usr/local/bin/forkyard-health 127.0.0.1:50055 forkyard.no.such.Service >/dev/null 2>&1 && asked=served || asked=refused
check "the healthcheck fails for a service the replica does not serve ($asked)" test "$asked" = refused

# ---- a run spread over the replicas ---------------------------------------------------------
run=$(launch 12 12 'bash agent.sh 1')
state=$(wait_terminal "$run" 120) || true
check "12-fork run completed ($state)" test "$state" = RUN_STATE_COMPLETED
succeeded=$(grpc $G1 forkyard.gateway.v1.Gateway/GetRun "{\"run_id\":\"$run\"}" | json 'sum(1 for f in d.get("forks",[]) if f.get("status")=="FORK_STATUS_SUCCEEDED")')
check "every fork succeeded ($succeeded of 12), read through the other gateway replica" test "$succeeded" = 12

used=0; creates=""
for c in $(containers sandbox-provisioner); do
  n=$(metric "$(ip_of "$c"):9452" 'grpc_server_request_duration_seconds_count{code="OK",method="forkyard.sandbox.v1.SandboxProvisioner/CreateSandbox"')
  creates="$creates $n"; [ "$n" -gt 0 ] && used=$((used + 1))
done
check "sandboxes made on several provisioner replicas (creates per replica:$creates)" test "$used" -ge 2
used=0; agents=""
for c in $(containers agent-runner); do
  n=$(metric "$(ip_of "$c"):9453" 'agent_cost_usd_count')
  agents="$agents $n"; [ "$n" -gt 0 ] && used=$((used + 1))
done
check "agents ran on both runner replicas (agents per replica:$agents)" test "$used" = 2

missing=0
for f in $(seq 1 12); do
  t=$(grpc $G2 forkyard.gateway.v1.Gateway/GetForkResult "{\"run_id\":\"$run\",\"fork\":$f}" | json 'd.get("transcript","")')
  case "$t" in *working*) ;; *) missing=$((missing + 1)) ;; esac
done
check "GetForkResult has every fork's transcript whichever runner ran it ($missing missing)" test "$missing" = 0

check_ledger_exact "12-fork run, twelve agents' reports" "$run" $((12 * AGENT_REPORT_MICROS))

# ---- a cancelled run: transcripts still found ------------------------------------------------
run=$(launch 4 4 'bash agent.sh 120')
wait_until 60 "the 4 forks to be cancelled are running their agents" forks_in_phase_are "$run" "running agent" 4 || true
sleep 1
grpc $G1 forkyard.gateway.v1.Gateway/CancelRun "{\"run_id\":\"$run\"}" >/dev/null
state=$(wait_terminal "$run" 60) || true
check "cancelled run ended ($state)" test "$state" = RUN_STATE_CANCELLED
# The sleeps were cancelled before they reported anything: nothing spent.
check_ledger_exact "cancelled run" "$run" 0
missing=0
for f in 1 2 3 4; do
  t=$(grpc $G2 forkyard.gateway.v1.Gateway/GetForkResult "{\"run_id\":\"$run\",\"fork\":$f}" | json 'd.get("transcript","")')
  case "$t" in *working*) ;; *) missing=$((missing + 1)) ;; esac
done
check "cancelled forks' transcripts found on whichever runner ran them ($missing missing)" test "$missing" = 0

# ---- one janitor sweep reaches every provisioner replica ---------------------------------------
for c in $(containers sandbox-provisioner); do
  grpc "$(ip_of "$c"):50052" forkyard.sandbox.v1.SandboxProvisioner/CreateSandbox \
    "{\"repo\":\"/repos/demo\",\"branch\":\"orphan\",\"labels\":{\"purpose\":\"orphan-test\"}}" >/dev/null
done
report=$(grpc "$(ip_of "$(containers janitor)"):50055" forkyard.janitor.v1.Janitor/SweepNow '{}')
destroyed=$(echo "$report" | json 'sum(1 for a in d.get("actions",[]) if a.get("destroyed"))')
left=0
for c in $(containers sandbox-provisioner); do
  n=$(grpc "$(ip_of "$c"):50052" forkyard.sandbox.v1.SandboxProvisioner/ListSandboxes '{}' | json 'len(d.get("sandboxes",[]))')
  left=$((left + n))
done
check "one sweep destroyed an orphan on each of 3 replicas ($destroyed destroyed, $left left)" test "$destroyed" = 3 -a "$left" = 0

# ---- Prometheus finds and scrapes every replica (DNS service discovery) -----------------
prom=$(ip_of "$(containers prometheus)"):9090
deadline=$((SECONDS + 90))
while :; do
  up=$(curl -s "http://$prom/api/v1/targets?state=active" |
    json 'sorted(set((t["labels"].get("service"), t["labels"]["instance"]) for t in d["data"]["activeTargets"] if t["labels"].get("job") == "forkyard" and t["health"] == "up"))' 2>/dev/null || echo "[]")
  n=$(python3 -c "import ast,sys; print(len(ast.literal_eval(sys.argv[1])))" "$up")
  [ "$n" -ge 10 ] || [ $SECONDS -ge $deadline ] && break
  sleep 3
done
check "Prometheus scrapes every replica ($n of 10 up)" test "$n" = 10

# ---- SIGTERM of any replica drains it: no fork fails ------------------------------------------
# The victim: a provisioner replica holding sandboxes of the run, a runner replica, a
# gateway replica (the one the run was launched through; the other is asked), a ledger
# replica, the janitor.
holding() { grpc "$(ip_of "$1"):50052" forkyard.sandbox.v1.SandboxProvisioner/ListSandboxes '{}' | json 'len(d.get("sandboxes",[]))'; }
for service in sandbox-provisioner agent-runner gateway budget-ledger janitor; do
  run=$(launch 6 6 'bash agent.sh 4')
  sleep 2
  case $service in
    sandbox-provisioner) victim=""; for c in $(containers sandbox-provisioner); do [ "$(holding "$c")" -gt 0 ] && victim=$c && break; done ;;
    gateway) victim=$(containers gateway | sed -n 1p) ;;
    *) victim=$(containers "$service" | sed -n 1p) ;;
  esac
  [ -n "$victim" ] || { fail "no $service replica holds a sandbox of the run"; continue; }
  started=$SECONDS
  # Within the replica's own grace period (Compose's stop_grace_period: 330 s for a
  # provisioner, 60 s for the others), past which Docker kills it (exit 137).
  docker stop "$victim" >/dev/null
  took=$((SECONDS - started))
  exited=$(docker inspect -f '{{.State.ExitCode}}' "$victim")
  check "docker stop of $victim mid-run: drained and exited 0 within its grace period (exit $exited after ${took}s)" test "$exited" = 0
  state=$(wait_terminal "$run" 120) || true
  check "run across the stop of $victim ended ($state)" test "$state" = RUN_STATE_COMPLETED
  check_forks_succeeded "run across the stop of $victim" "$run" 6
  check_ledger_exact "run across the stop of $victim, six agents' reports" "$run" $((6 * AGENT_REPORT_MICROS))
  docker start "$victim" >/dev/null
  wait_serving
  G1=$(ip_of "$(containers gateway | sed -n 1p)"):50051
  G2=$(ip_of "$(containers gateway | sed -n 2p)"):50051
done

echo
if [ "$failures" -gt 0 ]; then echo "test-containers: $failures failed"; exit 1; fi
echo "test-containers: all passed"
