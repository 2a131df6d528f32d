# Shared by the container tests: the stack (deploy/compose.replicas.yml) under a project
# of the caller's ($project), helpers to reach every replica by its container address,
# and the checks' bookkeeping. Sourced, not run.
export PATH="${TOOLS_VENV:-$HOME/.cache/forkyard/venv}/bin:$PATH"
# The scripted model server the agent runners call (compose.test.yml): this host's build
# (`make test-containers` builds it with the workspace).
export FORKYARD_SCRIPTED_MODEL=${FORKYARD_SCRIPTED_MODEL:-$(realpath -m "${CARGO_TARGET_DIR:-target}")/debug/scripted-model}
[ -x "$FORKYARD_SCRIPTED_MODEL" ] || { echo "no $FORKYARD_SCRIPTED_MODEL: cargo build -p forkyard-tests --bin scripted-model" >&2; exit 1; }
repos=$(mktemp -d "/var/tmp/$project-repos.XXXXXX")
export FORKYARD_REPOS=$repos
# Host ports: any free ones (the test reaches every replica by its container address).
export FORKYARD_GATEWAY_PORTS="127.0.0.1:"
export FORKYARD_CONSOLE_PORT="127.0.0.1:"
# The deploy file and the tests' settings over it (tests/containers/compose.test.yml).
C=(docker-compose -f deploy/compose.replicas.yml -f tests/containers/compose.test.yml -p "$project")
failures=0

cleanup() {
  if [ "$failures" -gt 0 ] || [ -n "${KEEP_LOGS:-}" ]; then
    "${C[@]}" logs --no-color >"${LOG_DIR:-/tmp}/$project.log" 2>&1 || true
    echo "container logs: ${LOG_DIR:-/tmp}/$project.log"
  fi
  "${C[@]}" down -v -t 5 >/dev/null 2>&1 || true
  rm -rf "$repos" "$repos.up.log"
}
trap cleanup EXIT

pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
# Polls a command until it succeeds. On the deadline the wait is a failed check naming
# what never happened (a test never carries on as if it had), and returns 1.
wait_until() { # seconds, what, command...
  local secs=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@"; do
    [ $SECONDS -lt $deadline ] || { fail "not within ${secs}s: $what"; return 1; }
    sleep 0.5
  done
}

ip_of() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }
containers() { "${C[@]}" ps -q "$1" | xargs -r docker inspect -f '{{.Name}}' | sed 's#^/##' | sort; }
grpc() { local addr=$1 method=$2 body=${3:-'{}'}; grpcurl -plaintext -max-time 30 -d "$body" "$addr" "$method"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
# The sum of a metric's samples matching a pattern on one replica's /metrics.
metric() { curl -s "http://$1/metrics" | awk -v pat="$2" '$0 !~ /^#/ && index($0, pat) == 1 { s += $NF } END { print s + 0 }'; }

# Every replica of every service running and SERVING: the count compose was asked for
# (a replica restarting after an exit is not listed by `ps`, so a count short of it is
# waited for, not skipped). On a deadline, says which and shows its state and log.
REPLICAS="gateway=2 sandbox-provisioner=3 agent-runner=2 budget-ledger=2 janitor=1"
PORTS="gateway=50051 sandbox-provisioner=50052 agent-runner=50053 budget-ledger=50054 janitor=50055"
wait_serving() {
  local deadline=$((SECONDS + 180)) svc want port c n
  for pair in $REPLICAS; do
    svc=${pair%%=*} want=${pair#*=}
    port=$(echo "$PORTS" | tr ' ' '\n' | sed -n "s/^$svc=//p")
    until n=$(containers "$svc" | wc -l); [ "$n" -ge "$want" ]; do
      [ $SECONDS -lt $deadline ] || { fail "$svc: $n of $want replicas running"; show_service "$svc"; return 1; }
      start_left_created
      sleep 1
    done
    for c in $(containers "$svc"); do
      until grpc "$(ip_of "$c"):$port" grpc.health.v1.Health/Check 2>/dev/null | grep '"SERVING"' >/dev/null; do
        [ $SECONDS -lt $deadline ] || { fail "$c never SERVING"; show_service "$svc"; return 1; }
        start_left_created
        sleep 1
      done
    done
  done
}

# The Docker health state of every replica of the five services (their `healthcheck:`,
# forkyard-health), as "container=state" words.
health_states() {
  local svc c
  for svc in gateway sandbox-provisioner agent-runner budget-ledger janitor console; do
    for c in $(containers "$svc"); do
      echo "$c=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$c")"
    done
  done | tr '\n' ' '
}
all_healthy() { ! health_states | tr ' ' '\n' | grep -v '=healthy$' | grep -q .; }

# Compose has exited 0 from `up -d` with replicas created and never started (CI, compose
# 2.40; their dependency, Temporal, was healthy by then): once both gateways, once every
# service, so a gateway waited on could never see its peers. Any container of the stack
# still only created 20 s after compose was done is started here, whichever service is
# being waited on, saying so; if the engine refuses, its error is printed and the checks
# fail as before.
start_left_created() {
  local c
  [ $((SECONDS - ${stack_up_at:-0})) -ge 20 ] || return 0
  for c in $("${C[@]}" ps -a -q --status created 2>/dev/null); do
    echo "note: $(docker inspect -f '{{.Name}}' "$c" | sed 's#^/##') was left created, not started, by compose; starting it"
    docker start "$c" >/dev/null || true
  done
}

# A service's containers, running or not, the engine's last error for each, the end of its
# log, compose's own output and the engine's log: printed where CI shows it.
show_service() {
  "${C[@]}" ps -a "$1" || true
  "${C[@]}" ps -a -q "$1" 2>/dev/null | xargs -r docker inspect -f '{{.Name}}: {{.State.Status}} error={{printf "%q" .State.Error}} exit={{.State.ExitCode}}' || true
  "${C[@]}" logs --no-color --tail 40 "$1" 2>&1 || true
  [ -s "${up_log:-}" ] && { echo "--- docker-compose up -d:"; tail -40 "$up_log"; }
  local dockerd=${FORKYARD_STATE_DIR:-.forkyard}/logs/dockerd.log
  [ -s "$dockerd" ] && { echo "--- $dockerd (end):"; tail -30 "$dockerd"; }
  return 0
}

# A gateway call through whichever gateway replica answers.
gw() {
  local c out
  for c in $(containers gateway); do
    if out=$(grpc "$(ip_of "$c"):50051" "$@" 2>/dev/null); then echo "$out"; return 0; fi
  done
  grpc "$(ip_of "$(containers gateway | head -1)"):50051" "$@"
}

wait_terminal() {
  local run=$1 deadline=$((SECONDS + ${2:-120})) state
  while :; do
    state=$(gw forkyard.gateway.v1.Gateway/GetRun "{\"run_id\":\"$run\"}" | json 'd.get("state","")')
    case "$state" in RUN_STATE_COMPLETED | RUN_STATE_FAILED | RUN_STATE_CANCELLED) echo "$state"; return 0 ;; esac
    [ $SECONDS -lt $deadline ] || { echo "$state"; return 1; }
    sleep 1
  done
}

launch() { # forks, max_concurrent, agent command[, JSON of more LaunchRunRequest fields]
  gw forkyard.gateway.v1.Gateway/LaunchRun "$(launch_request "$@")" | json 'd["runId"]'
}
launch_request() {
  python3 -c '
import json, sys
req = {"repo": "/repos/demo", "prompt": "p", "forks": int(sys.argv[1]),
       "max_concurrent": int(sys.argv[2]), "budget_usd": "5", "agent": {"command": sys.argv[3]}}
req.update(json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
print(json.dumps(req))' "$@"
}

get_run() { gw forkyard.gateway.v1.Gateway/GetRun "{\"run_id\":\"$1\"}"; }
# How many of a run's forks are in a phase ("running agent", ...).
forks_in_phase() { get_run "$1" | json "sum(1 for f in d.get('forks',[]) if f.get('phase')=='$2')"; }
forks_in_phase_are() { [ "$(forks_in_phase "$1" "$2")" = "$3" ]; }
ledger() { grpc "$(ip_of "$(containers budget-ledger | head -1)"):50054" "$@"; }

# Every agent.sh run reports $0.01 once, at its end: 10,000 µ$.
AGENT_REPORT_MICROS=10000

# Each of the run's forks SUCCEEDED: all `forks` of them listed, and the run's count agrees.
check_forks_succeeded() { # what, run, forks
  local what=$1 run=$2 want=$3 got
  got=$(get_run "$run" | json '"%d listed, %d succeeded, not succeeded: %s" % (len(d.get("forks",[])), d.get("forksSucceeded",0),
    ",".join("%s %s %s" % (f.get("fork"), f.get("status"), f.get("error","")[:120]) for f in d.get("forks",[]) if f.get("status")!="FORK_STATUS_SUCCEEDED") or "none")')
  check "$what: every fork succeeded ($got)" test "$got" = "$want listed, $want succeeded, not succeeded: none"
}

# The ledger holds exactly `micros` for the run, a sum known without the run's word (what
# its agents reported): the account's spend, its reservations' commits and the run's own
# cost all equal it, nothing is reserved and no reservation is still held. A double
# charge, or a charge lost, fails here even when the run reports it too.
check_ledger_exact() { # what, run, micros
  local what=$1 run=$2 want=$3 account reservations spent reserved committed held cost
  account=$(ledger forkyard.budget.v1.BudgetLedger/GetAccount "{\"account_id\":\"$run\"}")
  spent=$(echo "$account" | json 'd.get("spentMicros","0")')
  reserved=$(echo "$account" | json 'd.get("reservedMicros","0")')
  reservations=$(ledger forkyard.budget.v1.BudgetLedger/ListReservations "{\"account_id\":\"$run\"}")
  held=$(echo "$reservations" | json 'sum(1 for r in d.get("reservations",[]) if r.get("state")=="RESERVATION_STATE_HELD")')
  committed=$(echo "$reservations" | json 'sum(int(r.get("committedMicros","0")) for r in d.get("reservations",[]))')
  cost=$(get_run "$run" | json 'd.get("costMicros","0")')
  check "$what: ledger exact ($want µ\$ expected; spent $spent, committed $committed, the run's cost $cost, reserved $reserved, $held held)" \
    test "$spent" = "$want" -a "$committed" = "$want" -a "$cost" = "$want" -a "$reserved" = 0 -a "$held" = 0
}

# The stack from scratch, with a repository at /repos/demo holding agent.sh.
start_stack() {
  repo=$repos/demo
  git init -q -b main "$repo"
  printf 'hello\n' >"$repo/greet.txt"
  # The agents: scripts in the repository (SLEEP seconds of work, then a cost report the
  # way `claude -p --output-format json` prints one).
  printf '%s\n' 'echo "fork $FORKYARD_FORK" >> greet.txt' 'echo working' 'sleep "${1:-1}"' \
    "echo '{\"total_cost_usd\": 0.01}'" >"$repo/agent.sh"
  git -C "$repo" add -A && git -C "$repo" -c user.name=t -c user.email=t@x commit -q -m init
  chown -R 65532:65532 "$repos"

  "${C[@]}" down -v -t 1 >/dev/null 2>&1 || true
  up_log=$repos.up.log
  "${C[@]}" up -d --quiet-pull >"$up_log" 2>&1 || { cat "$up_log"; exit 1; }
  stack_up_at=$SECONDS
  wait_serving || exit 1
  G1=$(ip_of "$(containers gateway | sed -n 1p)"):50051
  G2=$(ip_of "$(containers gateway | sed -n 2p)"):50051
  L=$(ip_of "$(containers budget-ledger | sed -n 1p)"):50054
  counts=$(for s in gateway sandbox-provisioner agent-runner budget-ledger janitor; do echo -n "$s=$(containers $s | wc -l) "; done)
  check "replicas up and SERVING: $counts" test "$counts" = "$REPLICAS "
}
