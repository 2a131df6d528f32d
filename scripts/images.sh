#!/usr/bin/env bash
# Builds Forkyard's images into the local Docker engine from binaries built on this host
# (Dockerfile, BINARIES=host): forkyard/<target>:$TAG for every service (the console too), the CLI, a
# Temporal dev server, PostgreSQL and Prometheus. Needs the base image (scripts/base-image.sh)
# and the agent CLIs (make deps-agents) the provisioner image carries.
#
#   scripts/images.sh                  release binaries, tag "local"
#   PROFILE=debug scripts/images.sh    the debug binaries `make test` already built
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-release}
TAG=${FORKYARD_IMAGE_TAG:-local}
BASE=${FORKYARD_BASE_IMAGE:-forkyard/debian:bookworm}
TARGETS=(gateway sandbox-provisioner agent-runner budget-ledger janitor console cli temporal-dev postgres prometheus)
BINS=(gateway sandbox-provisioner sandbox-egress-forwarder agent-runner budget-ledger janitor console forkyard forkyard-health)
TOOLS_VENV=${TOOLS_VENV:-$HOME/.cache/forkyard/venv}
target_dir=${CARGO_TARGET_DIR:-target}

# BuildKit (it builds only the stages a target needs): `docker buildx`, or the classic
# client's DOCKER_BUILDKIT=1 (Debian's docker.io). A newer client without the buildx
# plugin can do neither, so the engine's own client is preferred then.
docker_build() {
  if docker buildx version >/dev/null 2>&1; then
    docker buildx build --load "$@"
  elif [ -x /usr/bin/docker ] && DOCKER_BUILDKIT=1 /usr/bin/docker build --help >/dev/null 2>&1; then
    DOCKER_BUILDKIT=1 /usr/bin/docker build "$@"
  else
    DOCKER_BUILDKIT=1 docker build "$@"
  fi
}

case "$PROFILE" in
  release) cargo build --release --locked --workspace --bins; out="$target_dir/release" ;;
  debug) cargo build --locked --workspace --bins; out="$target_dir/debug" ;;
  *) echo "images: PROFILE must be release or debug, not $PROFILE" >&2; exit 64 ;;
esac
[ -x "$TOOLS_VENV/bin/temporal" ] || { echo "images: no Temporal CLI in $TOOLS_VENV (make deps-pip)" >&2; exit 1; }

# The binaries, without debug info (symbols stay, for backtraces).
stage=target/image-bins
rm -rf "$stage" && mkdir -p "$stage"
for b in "${BINS[@]}"; do
  objcopy --strip-debug "$out/$b" "$stage/$b"
done
cp "$TOOLS_VENV/bin/temporal" "$stage/temporal"
# The pinned agent CLIs the sandbox-provisioner image carries (target/image-agents).
scripts/stage-agents.sh

# One context upload: the staged binaries become an image every target copies from.
docker_build -q --target host -t "forkyard/image-bins:$TAG" . >/dev/null
for t in "${TARGETS[@]}"; do
  docker_build -q --build-arg "BASE=$BASE" --build-arg "BINARIES=forkyard/image-bins:$TAG" \
    --target "$t" -t "forkyard/$t:$TAG" . >/dev/null
  echo "images: forkyard/$t:$TAG ($(docker image inspect -f '{{.Size}}' "forkyard/$t:$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
done
# The images this build replaced (untagged now), and only Forkyard's; and the build
# cache beyond what the next build reuses (each build's binaries are a new 600 MB layer,
# which filled a CI machine's disk once).
docker image prune -f --filter label=dev.forkyard.image=true >/dev/null
docker builder prune -f --keep-storage 3gb >/dev/null 2>&1 || true
# On a small disk (CI's, where the tests' build, these images and an earlier commit's
# must fit in about 15 GB), what only this build needed goes too: the staged binaries,
# the image every target copied from, and the rest of the build cache.
free_gb=$(df -BG --output=avail . | tail -1 | tr -dc 0-9)
if [ "$free_gb" -lt "${FORKYARD_DISK_LOW_GB:-20}" ]; then
  rm -rf "$stage"
  docker rmi "forkyard/image-bins:$TAG" >/dev/null 2>&1 || true
  docker builder prune -af >/dev/null 2>&1 || true
  echo "images: ${free_gb}G free before, $(df -BG --output=avail . | tail -1 | tr -dc 0-9)G after removing the build's staging"
fi
