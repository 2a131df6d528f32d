#!/bin/sh
# forkyard/debian:bookworm: Debian bookworm made from Debian's own packages (debootstrap,
# minbase) and imported into the local Docker engine, so images build with no image
# registry. About half a minute to three minutes, once: an existing image is kept
# (FORKYARD_REBUILD_BASE=1 makes it again, e.g. for security updates).
set -eu
image=${FORKYARD_BASE_IMAGE:-forkyard/debian:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
docker=${DOCKER:-docker}

if [ -z "${FORKYARD_REBUILD_BASE:-}" ] && $docker image inspect "$image" >/dev/null 2>&1; then
  exit 0
fi
command -v debootstrap >/dev/null || { echo "base-image: debootstrap is not installed (make deps-images)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "base-image: debootstrap needs root" >&2; exit 1; }

work=$(mktemp -d /var/tmp/forkyard-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "base-image: debootstrap bookworm from $mirror"
debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
root=$work/rootfs
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
SOURCES
# What an image build does not need: package caches and indexes, docs, man pages.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/var/log/*.log
# Keep docs and man pages out of every later apt-get install too.
cat >"$root/etc/dpkg/dpkg.cfg.d/01-forkyard-nodoc" <<NODOC
path-exclude=/usr/share/doc/*
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
NODOC
echo 'APT::Install-Recommends "false";' >"$root/etc/apt/apt.conf.d/01-forkyard-norecommends"
tar --numeric-owner -C "$root" -c . \
  | $docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' \
      -m "debootstrap --variant=minbase bookworm $mirror" - "$image" >/dev/null
echo "base-image: $image ($($docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
