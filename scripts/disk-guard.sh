#!/usr/bin/env bash
# Before a step that writes gigabytes (images, an earlier commit's build): say how much
# of the disk is free and, when it is under FORKYARD_DISK_LOW_GB (default 20), remove
# what the next build makes again: the compiler's incremental data, the test
# executables, earlier commits' upgrade builds, and Forkyard's unused images and
# Docker's build cache. A CI machine once had 0.9 GB left when `make test` reached its
# images, and another ran out during the tests.
#
#   scripts/disk-guard.sh <step>
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: disk-guard.sh <step>}
low=${FORKYARD_DISK_LOW_GB:-20}
target_dir=${CARGO_TARGET_DIR:-target}

free_gb() { df -BG --output=avail . | tail -1 | tr -dc 0-9; }

before=$(free_gb)
echo "$step: ${before}G free on $(df --output=target . | tail -1)"
[ "$before" -lt "$low" ] || exit 0

echo "$step: under ${low}G free; removing what a build makes again"
rm -rf "$target_dir"/*/incremental
# The test executables (cargo's deps/ files no bin hard-links to): `make test` ran them
# already, and the next `cargo nextest` links them again (3.5 GB of the 5.8 of a build).
find "$target_dir"/*/deps -maxdepth 1 -type f -executable -links 1 ! -name '*.*' -delete 2>/dev/null || true
keep=${UPGRADE_FROM:-}
for d in "$target_dir"/at-*; do
  [ -d "$d" ] && [ "$d" != "$target_dir/at-$keep" ] && rm -rf "$d"
done
# Docker's: only Forkyard's untagged images, and the build cache beyond what the next
# image build reuses (scripts/images.sh keeps 3 GB), never other projects' images.
if docker info >/dev/null 2>&1; then
  docker image prune -f --filter label=dev.forkyard.image=true >/dev/null || true
  docker builder prune -f --keep-storage 1gb >/dev/null 2>&1 || true
fi
echo "$step: ${before}G free before, $(free_gb)G now"
