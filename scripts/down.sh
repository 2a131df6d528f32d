#!/usr/bin/env bash
# Stop the local stack: services first (SIGTERM, they drain), the Temporal dev server last.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
for s in console gateway janitor agent-runner sandbox-provisioner budget-ledger temporal; do stop "$s"; done
