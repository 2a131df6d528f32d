# syntax=docker/dockerfile:1.7
# Forkyard's container images: one build stage compiles every service binary once, then
# one small runtime stage per service. Build one with its target name, e.g.
#
#   docker build --target gateway -t forkyard/gateway .
#
# targets: gateway, sandbox-provisioner, agent-runner, budget-ledger, janitor
# (deploy/docker-compose.yml builds all five).

ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

# ---- build -------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-${DEBIAN} AS build
# protoc for the forkyard-proto build script; nothing else is linked from the system
# (SQLite is bundled, TLS is rustls).
# Debian packages follow the release (security fixes), so they are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The registry and target dir are cache mounts, so a rebuild only compiles what changed;
# the binaries are copied out of the cache mount into /out for the runtime stages.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace --bins \
 && mkdir -p /out/state \
 && cp target/release/gateway target/release/sandbox-provisioner \
       target/release/sandbox-egress-forwarder target/release/agent-runner \
       target/release/budget-ledger target/release/janitor target/release/forkyard /out/

# ---- runtime bases -----------------------------------------------------------------
# Services that run no program of their own: distroless (glibc, libgcc, CA certificates,
# no shell), as the unprivileged user 65532. The state directory is an empty directory
# owned by that user, so a fresh volume mounted there is writable too.
FROM gcr.io/distroless/cc-debian12:nonroot AS distroless
COPY --from=build --chown=65532:65532 /out/state /var/lib/forkyard
ENV FORKYARD_STATE_DIR=/var/lib/forkyard \
    RUST_LOG=info \
    TEMPORAL_ADDRESS=""
# TEMPORAL_ADDRESS is deliberately empty in the images: the service default
# (localhost:7233) is right on a laptop and never in a pod, so a container started
# without it exits 64 at once with "TEMPORAL_ADDRESS (--temporal-address) is empty".
USER 65532:65532

# ---- gateway: runs `git ls-remote` to check a run's repository -----------------------
FROM debian:${DEBIAN}-slim AS gateway
# Debian packages follow the release (security fixes), so they are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates git openssh-client \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 forkyard \
 && useradd --uid 65532 --gid 65532 --home-dir /var/lib/forkyard --create-home --shell /usr/sbin/nologin forkyard
COPY --from=build /out/gateway /out/forkyard /usr/local/bin/
ENV FORKYARD_LISTEN=0.0.0.0:50051 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9451 \
    FORKYARD_STATE_DIR=/var/lib/forkyard \
    RUST_LOG=info \
    TEMPORAL_ADDRESS=""
USER 65532:65532
EXPOSE 50051 9451
ENTRYPOINT ["/usr/local/bin/gateway"]

# ---- sandbox-provisioner: bubblewrap sandboxes --------------------------------------
# The sandbox's /usr is this image's /usr (bound read-only), so every program an agent
# or a verify command runs must be installed here: extend this stage (or build FROM it)
# with your toolchains and agent CLIs. bubblewrap needs unprivileged user namespaces
# and must not be blocked by the runtime's seccomp/AppArmor profiles: see k8s/README.md.
# tini is PID 1 so processes that escape to PID 1 are reaped.
FROM debian:${DEBIAN}-slim AS sandbox-provisioner
# Debian packages follow the release (security fixes), so they are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bubblewrap ca-certificates git openssh-client tini bash coreutils findutils grep sed diffutils patch procps \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 forkyard \
 && useradd --uid 65532 --gid 65532 --home-dir /var/lib/forkyard --create-home --shell /usr/sbin/nologin forkyard
# The egress forwarder is found next to the provisioner binary.
COPY --from=build /out/sandbox-provisioner /out/sandbox-egress-forwarder /usr/local/bin/
# FORKYARD_ADVERTISE_ENDPOINT is empty for the same reason as TEMPORAL_ADDRESS: its
# default (http://<listen address>) would be http://0.0.0.0:50052 here, which no other
# replica can dial; a container must say how it is reached (Compose: its service name;
# Kubernetes: the pod IP).
ENV FORKYARD_LISTEN=0.0.0.0:50052 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9452 \
    FORKYARD_ADVERTISE_ENDPOINT="" \
    FORKYARD_STATE_DIR=/var/lib/forkyard \
    RUST_LOG=info \
    TEMPORAL_ADDRESS=""
USER 65532:65532
EXPOSE 50052 9452
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/sandbox-provisioner"]

# ---- agent-runner -------------------------------------------------------------------
FROM distroless AS agent-runner
COPY --from=build /out/agent-runner /usr/local/bin/agent-runner
ENV FORKYARD_LISTEN=0.0.0.0:50053 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9453
EXPOSE 50053 9453
ENTRYPOINT ["/usr/local/bin/agent-runner"]

# ---- budget-ledger ------------------------------------------------------------------
FROM distroless AS budget-ledger
COPY --from=build /out/budget-ledger /usr/local/bin/budget-ledger
ENV FORKYARD_LISTEN=0.0.0.0:50054 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9454
EXPOSE 50054 9454
ENTRYPOINT ["/usr/local/bin/budget-ledger"]

# ---- janitor ------------------------------------------------------------------------
FROM distroless AS janitor
COPY --from=build /out/janitor /usr/local/bin/janitor
ENV FORKYARD_LISTEN=0.0.0.0:50055 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9455
EXPOSE 50055 9455
ENTRYPOINT ["/usr/local/bin/janitor"]
