#!/usr/bin/env bash
# A small multi-fork run on the local stack: a fresh git repo, 3 forks (2 at a time),
# each fork's command agent edits a file its own way and reports a cost.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
FORKYARD="$BIN_DIR/forkyard"

repo="$STATE_DIR/demo-repo"
rm -rf "$repo"
mkdir -p "$repo"
git -C "$repo" init -q -b main
git -C "$repo" config user.name "Forkyard Demo"
git -C "$repo" config user.email demo@forkyard.invalid
printf 'def greet():\n    return "hello"\n' >"$repo/greet.py"
git -C "$repo" add -A && git -C "$repo" commit -q -m "initial"

# The "agent": a command run inside each fork's sandbox, the prompt in $FORKYARD_PROMPT.
# It answers differently per fork and prints its cost the way `claude -p --output-format json` does.
agent='words=(hello hi hey); w=${words[$((FORKYARD_FORK-1))]:-howdy}
sed -i "s/\"hello\"/\"$w, world\"/" greet.py
echo "# $FORKYARD_PROMPT (fork $FORKYARD_FORK)" >> greet.py
sleep 1
printf "{\"total_cost_usd\": 0.0%d2, \"usage\": {\"input_tokens\": 1200, \"output_tokens\": 300}}\n" "$FORKYARD_FORK"'

echo "launching 3 forks (at most 2 at once, \$1 budget) on $repo"
set +e
"$FORKYARD" fork "$repo" -p "make the greeting friendlier" -f 3 --max-concurrent 2 --budget 1 \
  --agent-command "bash -c '$agent'" --wait
code=$?
set -e
echo
echo "Temporal UI: http://127.0.0.1:$TEMPORAL_UI_PORT  (workflow SandboxOrchestrationWorkflow; ForkWorkflow children for runs above --inline-fork-limit)"
echo "more: $FORKYARD list; $FORKYARD status <run-id>; make down"
echo "console: http://$CONSOLE_LISTEN/runs  (the run's forks, their diffs side by side, cancel)"
exit $code
