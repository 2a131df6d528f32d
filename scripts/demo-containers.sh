#!/usr/bin/env bash
# The demo on the mesh as replicated containers (deploy/compose.replicas.yml): a fresh git
# repository, 6 forks (3 at a time) spread over the provisioner and runner replicas.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${TOOLS_VENV:-$HOME/.cache/forkyard/venv}/bin:$PATH"
export FORKYARD_REPOS=${FORKYARD_REPOS:-$PWD/.forkyard/container-repos}
C=(docker-compose -f deploy/compose.replicas.yml)

repo=$FORKYARD_REPOS/demo
rm -rf "$repo" && mkdir -p "$repo"
git -C "$repo" init -q -b main
printf 'def greet():\n    return "hello"\n' >"$repo/greet.py"
cat >"$repo/agent.sh" <<'AGENT'
# The "agent": edits the file its own way and reports a cost as `claude -p` does.
words=(hello hi hey howdy hiya yo)
sed -i "s/\"hello\"/\"${words[$((FORKYARD_FORK - 1))]:-hello}, world\"/" greet.py
echo "# $FORKYARD_PROMPT (fork $FORKYARD_FORK, on $(hostname))" >>greet.py
sleep 1
printf '{"total_cost_usd": 0.0%d2, "usage": {"input_tokens": 1200, "output_tokens": 300}}\n' "$FORKYARD_FORK"
AGENT
git -C "$repo" add -A && git -C "$repo" -c user.name=demo -c user.email=demo@forkyard.invalid commit -q -m initial
# The services run as uid 65532 and read the repository through a read-only mount.
chown -R 65532:65532 "$FORKYARD_REPOS" 2>/dev/null || chmod -R a+rX "$FORKYARD_REPOS"

"${C[@]}" up -d --quiet-pull
echo "waiting for the gateway replicas"
for port in 50151 50152; do
  for _ in $(seq 1 120); do
    grpcurl -plaintext -max-time 2 -d '{}' "127.0.0.1:$port" grpc.health.v1.Health/Check 2>/dev/null | grep -q '"SERVING"' && break
    sleep 1
  done
done
"${C[@]}" ps --format 'table {{.Name}}\t{{.Status}}'
echo
echo "launching 6 forks (at most 3 at once, \$1 budget) on /repos/demo"
set +e
"${C[@]}" run --rm -T cli fork /repos/demo -p "make the greeting friendlier" -f 6 --max-concurrent 3 \
  --budget 1 --agent-command "bash agent.sh" --wait
code=$?
set -e
echo
echo "gateways: 127.0.0.1:50151 and 127.0.0.1:50152 (grpcurl -plaintext 127.0.0.1:50151 list)"
echo "console: http://$("${C[@]}" port console 8088 2>/dev/null || echo 127.0.0.1:8188)"
echo "CLI: ${C[*]} run --rm cli list; stop: make down-containers"
exit $code
