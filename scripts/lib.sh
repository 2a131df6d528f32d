# Shared by up.sh, down.sh and demo.sh: the local stack's layout and default ports.
STATE_DIR="${FORKYARD_STATE_DIR:-$PWD/.forkyard}"
BIN_DIR="${FORKYARD_BIN_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/debug}"
PID_DIR="$STATE_DIR/pids"
LOG_DIR="$STATE_DIR/logs"
TEMPORAL_PORT="${TEMPORAL_PORT:-7233}"
TEMPORAL_UI_PORT="${TEMPORAL_UI_PORT:-8233}"
export TEMPORAL_ADDRESS="${TEMPORAL_ADDRESS:-127.0.0.1:$TEMPORAL_PORT}"
export TEMPORAL_NAMESPACE="${TEMPORAL_NAMESPACE:-default}"
export FORKYARD_STATE_DIR="$STATE_DIR"

# service name → gRPC port (DESIGN.md defaults)
SERVICES=(gateway sandbox-provisioner agent-runner budget-ledger janitor)
declare -A PORT=([gateway]=50051 [sandbox-provisioner]=50052 [agent-runner]=50053 [budget-ledger]=50054 [janitor]=50055)
# The console (HTTP, not gRPC: started and checked apart from SERVICES).
CONSOLE_LISTEN="${FORKYARD_CONSOLE_LISTEN:-127.0.0.1:8088}"

alive() { [ -f "$PID_DIR/$1.pid" ] && kill -0 "$(cat "$PID_DIR/$1.pid")" 2>/dev/null; }

serving() {
  grpcurl -plaintext -max-time 2 -d '{}' "127.0.0.1:$1" grpc.health.v1.Health/Check 2>/dev/null | grep -q SERVING
}

# Stop service $1 (SIGTERM: it drains; SIGKILL after 10 s) and forget its pid.
stop() {
  local name=$1 pidfile="$PID_DIR/$1.pid"
  [ -f "$pidfile" ] || return 0
  local pid; pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "stopped $name"
  fi
  rm -f "$pidfile" "$PID_DIR/$name.settings"
}

# The settings a service is started with, one line per variable: its name and a digest
# of its value (a key's digest, never the key). Read from the environment `env "$@"`
# gives (the keys a service must not get already unset).
settings() {
  env "$@" env | grep -E '^(FORKYARD_|TEMPORAL_|OTEL_|RUST_LOG=|ANTHROPIC_|OPENAI_|GITHUB_TOKEN=|E2B_)' |
    while IFS='=' read -r name value; do
      printf '%s %s\n' "$name" "$(printf '%s' "$value" | sha256sum | cut -c1-16)"
    done | sort
}
