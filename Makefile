# sluice: the two commands a user needs, each installing what it needs.
#   make demo   the main job: a flooded DNS server (NSD) with and without sluice
#   make test   every test (unit, BPF_PROG_TEST_RUN, namespace integration)
# Both need root (XDP, network namespaces) and a Debian 12 machine (apt).

APT_PACKAGES := clang llvm libclang-dev libbpf-dev libelf-dev zlib1g-dev pkg-config \
                iproute2 ethtool util-linux python3 procps nftables fonts-dejavu-core tcpdump iputils-ping \
                nsd dnsperf nginx wrk
CARGO ?= cargo
BIN := target/release/sluice

.PHONY: all deps build demo test lint bench bench-full clean

all: build

# Install the Debian packages that are missing (needs root), and check for Rust.
# A policy-rc.d that answers 101 keeps the packages' services (nsd, nginx) from
# starting on install: the demo starts its own copy inside its namespace.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "run as root to install packages: $$missing" >&2; exit 1; fi; \
		made=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made=1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; rc=$$?; \
		if [ -n "$$made" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (1.82 or newer) with rustup" >&2; exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy

build: deps
	$(CARGO) build --release --locked

# The bench's short built-in scenario (a flooded echo service, off vs static vs auto,
# figures and report in results/demo), then the daemon in action (sluice bench demo).
demo: build
	$(BIN) bench demo
	$(BIN) bench run --scenario demo --out results/demo

# What a reviewer checks: formatting, clippy's lints, rustdoc, all as errors.
lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --locked --workspace

test: deps
	$(CARGO) test --release --locked --workspace

bench: build
	$(BIN) bench gate

bench-full: build
	$(BIN) bench run --scenario default

clean:
	$(CARGO) clean
