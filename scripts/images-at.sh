#!/usr/bin/env bash
# Images of an earlier commit, for the rolling-upgrade test: the commit checked out in a
# worktree of this clone and built there (scripts/images.sh of that commit, debug
# binaries without debug info, as this commit builds them, in a target dir of its own
# without incremental data: CI's disk is small), tagged forkyard/<target>:$2.
#
#   scripts/images-at.sh c36764a upgrade-from
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: images-at.sh <commit> <tag>}
tag=${2:?usage: images-at.sh <commit> <tag>}
root=$PWD
if ! git cat-file -e "$ref^{commit}" 2>/dev/null; then
  echo "images-at: commit $ref is not in this clone; fetching history" >&2
  git fetch --quiet --unshallow 2>/dev/null || git fetch --quiet origin "$ref" || {
    echo "images-at: cannot get commit $ref (a shallow clone without a remote?)" >&2; exit 1; }
fi
wt=${FORKYARD_UPGRADE_WORKTREE:-/var/tmp/forkyard-src-$ref}
if [ ! -d "$wt" ]; then
  git worktree add --quiet --detach "$wt" "$ref"
fi
cd "$wt"
CARGO_TARGET_DIR="$root/target/at-$ref" CARGO_INCREMENTAL=0 PROFILE=debug FORKYARD_IMAGE_TAG="$tag" \
  CARGO_PROFILE_DEV_DEBUG=false CARGO_PROFILE_DEV_STRIP=debuginfo \
  scripts/images.sh
# Its images are built: on a small disk (CI's), its build goes (a later run builds it
# again); elsewhere it is kept, so that the next run starts at once.
free_gb=$(df -BG --output=avail "$root" | tail -1 | tr -dc 0-9)
if [ "$free_gb" -lt "${FORKYARD_DISK_LOW_GB:-20}" ]; then
  rm -rf "$root/target/at-$ref"
fi
