#!/usr/bin/env bash
# The mesh as replicated containers (deploy/compose.replicas.yml, locally built images):
# every replica serves; runs spread over the provisioner and runner replicas; any gateway
# replica answers for any run; GetForkResult returns the transcript whichever runner
# replica ran the fork, cancelled forks included; one janitor sweep reaches every
# provisioner replica; the ledger is exact; `docker stop` (SIGTERM) of a provisioner,
# runner or gateway replica mid-run drains it without failing a fork; a `--driver
# claude-code` fork runs the claude CLI the provisioner image carries against the scripted
# model server. Driven over gRPC (grpcurl) and the forkyard CLI.
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
# The run console, through its published port: the runs page (no keys in this stack).
console_at=$("${C[@]}" port console 8088 | tail -1)
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$console_at/runs" || true)
check "the console answers its runs page on $console_at ($code)" test "$code" = 200
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

# ---- the agent CLIs the provisioner image carries: `--driver claude-code` and `codex` ----------
# One fork of each, launched with `forkyard fork --wait` from the cli container: its agent
# the real CLI in a sandbox on a provisioner replica, its model the scripted server
# through the runner's LLM gateway (compose.test.yml). The model's tool call runs
# probe.sh, which appends to notes.txt the first program above it from the agent tools,
# as the sandbox sees it (/run/forkyard/tools: only a sandbox has them there).
repo=$repos/demo
printf 'notes\n' >"$repo/notes.txt"
cat >"$repo/probe.sh" <<'PROBE'
p=$$ exe=
while [ "$p" -gt 1 ]; do
  e=$(readlink "/proc/$p/exe" || true)
  case "$e" in /run/forkyard/tools/*) exe=$e; break ;; esac
  p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status")
done
echo "edited under: ${exe:-no agent tool above $$}" >>notes.txt
PROBE
# (The repository is the containers' uid's already: git asks to be told it is safe.)
git -C "$repo" -c safe.directory="$repo" add -A
git -C "$repo" -c safe.directory="$repo" -c user.name=t -c user.email=t@x commit -q -m probe
chown -R 65532:65532 "$repo"
has=$(for c in $(containers agent-runner); do docker exec "$c" sh -c 'command -v claude codex node' || true; done)
check "no agent runner container has an agent CLI or node (${has:-none})" test -z "$has"
creates() { # CreateSandbox calls answered OK, over every provisioner replica
  local c n=0
  for c in $(containers sandbox-provisioner); do
    n=$((n + $(metric "$(ip_of "$c"):9452" 'grpc_server_request_duration_seconds_count{code="OK",method="forkyard.sandbox.v1.SandboxProvisioner/CreateSandbox"')))
  done
  echo "$n"
}
T=/run/forkyard/tools/lib/node_modules
# driver, model, the agent tool the sandbox ran it as, the model's path, the runner's key
# as the model sees it (the first 12 characters of its header), µ$ a scripted call costs
# (800 + 200 cached tokens in, 200 out, at the runner's price of the model)
agent_cli_fork() {
  local driver=$1 model=$2 exe=$3 path=$4 key=$5 per_call=$6 before started took out code run result patch log calls
  before=$(creates) started=$SECONDS
  out=$("${C[@]}" run --rm -T cli -o json fork /repos/demo --driver "$driver" -m "$model" -f 1 \
    --max-concurrent 1 --budget 1 -p "Add a line to notes.txt" --wait 2>"$repos/fork.err") && code=0 || code=$?
  took=$((SECONDS - started))
  run=$(echo "$out" | json 'd.get("runId","")' 2>/dev/null || true)
  check "forkyard fork --driver $driver --wait succeeded in ${took}s (exit $code, run ${run:-none}$([ $code = 0 ] || echo "; $(tail -3 "$repos/fork.err")"))" \
    test "$code" = 0 -a -n "$run"
  check "$driver: its sandbox made by a provisioner replica ($(($(creates) - before)) made)" test $(($(creates) - before)) = 1
  result=$(gw forkyard.gateway.v1.Gateway/GetForkResult "{\"run_id\":\"$run\",\"fork\":1}" 2>/dev/null || echo '{}')
  patch=$(echo "$result" | json 'd.get("patch","")')
  check "$driver: its patch holds the edit, made under the image's CLI in the sandbox ($(grep '^+edited' <<<"$patch" || echo 'no edit'))" \
    grep -qxF "+edited under: $exe" <<<"$patch"
  # The server prints each request as a JSON line: the calls that reached the model, and
  # the key each carried (its first 12 characters): the runner's, never the fork's token.
  log=$("${C[@]}" logs --no-color --no-log-prefix scripted-model 2>/dev/null | grep "\"path\":\"$path\"" || true)
  calls=$(grep -c . <<<"$log" || true)
  keys=$(python3 -c 'import json,sys; print(" ".join(sorted({str(json.loads(l).get("x-api-key") or json.loads(l).get("authorization")) for l in sys.stdin if l.strip()})))' <<<"$log")
  check "$driver: the model was called through the runner's LLM gateway with the runner's key ($calls calls, keys: $keys)" \
    test "$calls" -ge 2 -a "$keys" = "$key"
  check_ledger_exact "$driver fork, its model calls" "$run" $((calls * per_call))
}
# claude-sonnet: $3 in, $15 out, $0.30 cache read per million tokens; claude is native.
agent_cli_fork claude-code sonnet "$T/@anthropic-ai/claude-code/bin/claude.exe" /v1/messages sk-ant-api03 5460
# gpt-5: $1.25 in, $10 out, $0.125 cached; codex's native binary under its node launcher
# (Debian's node, in the image's /usr).
agent_cli_fork codex gpt-5 "$T/@openai/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex" /v1/responses "Bearer sk-pr" 3025

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
