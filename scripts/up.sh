#!/usr/bin/env bash
# Start the Temporal dev server and the five services in the background, on the default
# ports, and wait until every one reports SERVING. Safe to run again: what runs stays,
# unless its settings (FORKYARD_*, model keys, git credentials, ...) changed since it
# started: then it is restarted with the new ones.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
# The state directory holds the mesh's databases (Temporal's, the ledger's, the API
# keys'), transcripts and logs: its owner's only. What this script and the services it
# starts create is 0600 / 0700 (the services inherit the umask); what an earlier run left
# readable is narrowed. The directory itself keeps the search bit a provisioner run as
# root gives it, for its sandboxes' uids to reach their workspaces.
umask 077
mkdir -p "$PID_DIR" "$LOG_DIR"
chmod go-rw "$STATE_DIR"
chmod -R go-rwx "$PID_DIR" "$LOG_DIR"
[ ! -d "$STATE_DIR/artifacts" ] || chmod -R go-rwx "$STATE_DIR/artifacts"
find "$STATE_DIR" -maxdepth 1 -type f -exec chmod go-rwx {} +
# The local stack runs without API keys unless told otherwise (the gateway's own default
# is FORKYARD_AUTH=api-key): `FORKYARD_AUTH=api-key make up`, then `forkyard keys create`.
export FORKYARD_AUTH="${FORKYARD_AUTH:-none}"
# The pinned agent CLIs (`make deps-agents`), bound into every sandbox.
agent_tools=${FORKYARD_AGENT_TOOLS:-$HOME/.cache/forkyard/agents}
if [ -d "$agent_tools" ]; then export FORKYARD_AGENT_TOOLS="$agent_tools"; else unset FORKYARD_AGENT_TOOLS; fi
# The Rust toolchain a fork's `--verify 'cargo test'` needs: rustup's lives in this user's
# home, which sandboxes do not see, so the active one is offered to them read-only
# (/run/forkyard/toolchains/rust). FORKYARD_TOOLCHAINS set (even empty) is taken as is.
if [ -z "${FORKYARD_TOOLCHAINS+set}" ] && sysroot=$(rustc --print sysroot 2>/dev/null) \
  && [ -x "$sysroot/bin/cargo" ] && [ "${sysroot#/usr}" = "$sysroot" ]; then
  export FORKYARD_TOOLCHAINS="rust=$sysroot"
fi

# Model API keys (and the model endpoints) go to the agent runner alone (its LLM gateway
# injects them); every other service starts without them.
# Git credentials (a GitHub token, the credentials file) to the gateway and the
# provisioners alone: they check, clone and push; nothing else needs them.
MODEL_KEYS=(ANTHROPIC_API_KEY OPENAI_API_KEY ANTHROPIC_BASE_URL OPENAI_BASE_URL)
GIT_KEYS=(GITHUB_TOKEN FORKYARD_GIT_CREDENTIALS)

if ! alive temporal; then
  echo "starting temporal dev server on $TEMPORAL_ADDRESS (ui http://127.0.0.1:$TEMPORAL_UI_PORT)"
  # Neither kind of key: Temporal needs none, and its process would show them in /proc.
  no_keys=()
  for k in "${MODEL_KEYS[@]}" "${GIT_KEYS[@]}"; do no_keys+=(-u "$k"); done
  # WAL with NORMAL sync: survives a crash of the server process (not of the machine) and
  # takes a third of the CPU of SQLite's default journal (bench-fanout).
  nohup env "${no_keys[@]}" temporal server start-dev --ip 127.0.0.1 --port "$TEMPORAL_PORT" --ui-port "$TEMPORAL_UI_PORT" \
    --db-filename "$STATE_DIR/temporal.db" --sqlite-pragma journal_mode=wal --sqlite-pragma synchronous=normal \
    --log-level warn >"$LOG_DIR/temporal.log" 2>&1 &
  echo $! >"$PID_DIR/temporal.pid"
fi
for i in $(seq 1 120); do
  temporal operator cluster health --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1 && break
  alive temporal || { echo "temporal dev server exited; see $LOG_DIR/temporal.log"; tail -20 "$LOG_DIR/temporal.log"; exit 1; }
  sleep 0.5
done

for s in "${SERVICES[@]}"; do
  unset_keys=()
  if [ "$s" != agent-runner ]; then
    for k in "${MODEL_KEYS[@]}"; do unset_keys+=(-u "$k"); done
  fi
  if [ "$s" != gateway ] && [ "$s" != sandbox-provisioner ]; then
    for k in "${GIT_KEYS[@]}"; do unset_keys+=(-u "$k"); done
  fi
  # A service already running keeps running only if it was started with these very
  # settings: `ANTHROPIC_API_KEY=… make up` after `make demo` must reach the runner.
  wanted=$(settings "${unset_keys[@]}")
  if alive "$s"; then
    had=$(cat "$PID_DIR/$s.settings" 2>/dev/null || echo unknown)
    [ "$had" != "$wanted" ] || continue
    changed=$({ diff <(echo "$had") <(echo "$wanted") || true; } | sed -n 's/^[<>] \([A-Z_0-9]*\) .*/\1/p' | sort -u | tr '\n' ' ')
    echo "restarting $s: started with other settings (${changed:-unknown}); stopping it first"
    stop "$s"
  fi
  echo "starting $s on 127.0.0.1:${PORT[$s]}"
  # The provisioner sets the modes of what its sandboxes reach (their uids are others
  # to its files) from the usual umask; its own files it makes private itself.
  mask=077
  [ "$s" != sandbox-provisioner ] || mask=022
  (umask "$mask"; exec env "${unset_keys[@]}" \
    FORKYARD_LISTEN="127.0.0.1:${PORT[$s]}" \
    FORKYARD_PROVISIONER_ADDR="http://127.0.0.1:${PORT[sandbox-provisioner]}" \
    nohup "$BIN_DIR/$s") >"$LOG_DIR/$s.log" 2>&1 &
  echo $! >"$PID_DIR/$s.pid"
  echo "$wanted" >"$PID_DIR/$s.settings"
done

for s in "${SERVICES[@]}"; do
  for i in $(seq 1 240); do
    serving "${PORT[$s]}" && break
    if ! alive "$s"; then echo "$s exited; last log lines:"; tail -20 "$LOG_DIR/$s.log"; exit 1; fi
    sleep 0.25
  done
  serving "${PORT[$s]}" || { echo "$s did not report SERVING; see $LOG_DIR/$s.log"; exit 1; }
done

# The console: an HTTP front end calling the gateway with each visitor's own API key. It
# holds no key or credential of its own, so it starts with an empty environment.
console_env=(PATH="$PATH" RUST_LOG="${RUST_LOG:-info}" FORKYARD_CONSOLE_LISTEN="$CONSOLE_LISTEN"
  FORKYARD_GATEWAY="http://127.0.0.1:${PORT[gateway]}")
wanted=$(printf '%s\n' "${console_env[@]:1}")
if alive console && [ "$(cat "$PID_DIR/console.settings" 2>/dev/null)" != "$wanted" ]; then
  echo "restarting console: started with other settings; stopping it first"
  stop console
fi
if ! alive console; then
  echo "starting console on http://$CONSOLE_LISTEN"
  (exec env -i "${console_env[@]}" nohup "$BIN_DIR/console") >"$LOG_DIR/console.log" 2>&1 &
  echo $! >"$PID_DIR/console.pid"
  echo "$wanted" >"$PID_DIR/console.settings"
fi
for i in $(seq 1 80); do
  curl -fsS -o /dev/null "http://$CONSOLE_LISTEN/healthz" 2>/dev/null && break
  if ! alive console; then echo "console exited; last log lines:"; tail -20 "$LOG_DIR/console.log"; exit 1; fi
  sleep 0.25
done
curl -fsS -o /dev/null "http://$CONSOLE_LISTEN/healthz" || { echo "console did not answer; see $LOG_DIR/console.log"; exit 1; }
echo "forkyard is up: gateway 127.0.0.1:${PORT[gateway]}, console http://$CONSOLE_LISTEN, temporal ui http://127.0.0.1:$TEMPORAL_UI_PORT, logs in $LOG_DIR"
