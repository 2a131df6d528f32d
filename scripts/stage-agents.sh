#!/usr/bin/env bash
# Stages the agent CLIs for the sandbox-provisioner image (Dockerfile): the npm prefix
# `make deps-agents` fills with the pinned claude and codex (FORKYARD_AGENT_TOOLS, by
# default ~/.cache/forkyard/agents), copied into the build context at
# target/image-agents, hard-linked where the filesystem allows (instant, no space).
# Nothing is downloaded: the image carries the CLIs this host installed and tested.
# scripts/images.sh runs it; run it before a `docker compose ... build` too.
#
# Other versions: `make deps-agents AGENT_CLIS='@anthropic-ai/claude-code@X @openai/codex@Y'`
# (or the Makefile's pin), then `make images`.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${FORKYARD_AGENT_TOOLS:-$HOME/.cache/forkyard/agents}
stage=target/image-agents
for cli in claude codex; do
  "$src/bin/$cli" --version >/dev/null 2>&1 \
    || { echo "stage-agents: no working $cli in $src/bin (make deps-agents)" >&2; exit 1; }
done
rm -rf "$stage" && mkdir -p "$(dirname "$stage")"
cp -al "$src" "$stage" 2>/dev/null || { rm -rf "$stage"; cp -a "$src" "$stage"; }
echo "stage-agents: claude $("$stage/bin/claude" --version | cut -d' ' -f1)," \
  "codex $("$stage/bin/codex" --version | awk '{print $2}') from $src" \
  "($(du -sm "$stage" | cut -f1) MB)"
