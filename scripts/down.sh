#!/usr/bin/env bash
# Stop the local stack: services first (SIGTERM, they drain), the Temporal dev server last.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
stop() {
  local name=$1 pidfile="$PID_DIR/$1.pid"
  [ -f "$pidfile" ] || return 0
  local pid; pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "stopped $name"
  fi
  rm -f "$pidfile"
}
for s in gateway janitor agent-runner sandbox-provisioner budget-ledger temporal; do stop "$s"; done
