#!/bin/sh
# A running Docker engine: the one already up, or dockerd (Debian's docker.io) started
# in the background here, where no init system starts it (CI containers, fresh VMs).
set -eu
docker info >/dev/null 2>&1 && exit 0
command -v dockerd >/dev/null || { echo "docker-up: dockerd is not installed (make deps-docker)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "docker-up: the Docker engine is not running; start it (sudo systemctl start docker)" >&2; exit 1; }
log=${FORKYARD_STATE_DIR:-.forkyard}/logs/dockerd.log
mkdir -p "$(dirname "$log")"
echo "docker-up: starting dockerd (log: $log)"
nohup dockerd >"$log" 2>&1 &
i=0
until docker info >/dev/null 2>&1; do
  i=$((i + 1))
  [ $i -lt 60 ] || { echo "docker-up: dockerd did not come up in 30 s:" >&2; tail -20 "$log" >&2; exit 1; }
  sleep 0.5
done
