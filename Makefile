# sluice: the two commands a user needs, each installing what it needs
# (and make install / make deb for installing sluice itself).
#   make demo   the main job: a flooded DNS server (NSD) with and without sluice
#   make test   every test (unit, BPF_PROG_TEST_RUN, namespace integration)
# Both need root (XDP, network namespaces) and a Debian 12 machine (apt).

APT_PACKAGES := clang llvm libclang-dev libbpf-dev libelf-dev zlib1g-dev pkg-config \
                iproute2 ethtool util-linux python3 procps nftables fonts-dejavu-core tcpdump iputils-ping \
                nsd dnsperf nginx php-fpm wrk curl dpkg-dev prometheus python3-yaml systemd chromium-headless-shell
CARGO ?= cargo
BIN := target/release/sluice

.PHONY: all deps build demo test lint bench bench-full install uninstall deb package-deb clean

# Where `make install` puts things (the Debian package uses PREFIX=/usr and
# UNITDIR=/lib/systemd/system). DESTDIR stages into another root.
PREFIX ?= /usr/local
UNITDIR ?= $(PREFIX)/lib/systemd/system
GEN ?= target/generated

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

# The release binaries first: tests/package.rs packs them as `make deb` does.
test: build
	$(CARGO) test --release --locked --workspace --no-fail-fast

bench: build
	$(BIN) bench gate

bench-full: build
	$(BIN) bench run --scenario default

# The binaries, the systemd unit (its ExecStart pointed at $(PREFIX)/bin),
# /etc/default/sluice (kept if present), the man pages and the shell
# completions, which `sluice generate` makes from the command's own
# definition. Needs the release build (`make build`, or cargo build --release
# where apt is not the package manager).
install:
	@test -x $(BIN) -a -x target/release/sluice-bench || { echo "no release build: run make build (or cargo build --release) first" >&2; exit 1; }
	rm -rf $(GEN) && $(BIN) generate --out $(GEN)
	install -Dm755 $(BIN) $(DESTDIR)$(PREFIX)/bin/sluice
	install -Dm755 target/release/sluice-bench $(DESTDIR)$(PREFIX)/bin/sluice-bench
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)/etc/sluice $(DESTDIR)$(PREFIX)/share/man/man1
	sed 's|/usr/bin/sluice|$(PREFIX)/bin/sluice|' packaging/systemd/sluice@.service > $(DESTDIR)$(UNITDIR)/sluice@.service
	test -e $(DESTDIR)/etc/default/sluice || install -Dm644 packaging/default/sluice $(DESTDIR)/etc/default/sluice
	install -m644 $(GEN)/man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -Dm644 packaging/sluice.example.toml $(DESTDIR)$(PREFIX)/share/doc/sluice/sluice.example.toml
	install -Dm644 $(GEN)/completions/sluice.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sluice
	install -Dm644 $(GEN)/completions/_sluice $(DESTDIR)$(PREFIX)/share/zsh/vendor-completions/_sluice
	install -Dm644 $(GEN)/completions/sluice.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sluice.fish

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/sluice $(DESTDIR)$(PREFIX)/bin/sluice-bench $(DESTDIR)$(UNITDIR)/sluice@.service \
		$(DESTDIR)$(PREFIX)/share/man/man1/sluice*.1 $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sluice \
		$(DESTDIR)$(PREFIX)/share/zsh/vendor-completions/_sluice $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sluice.fish \
		$(DESTDIR)$(PREFIX)/share/doc/sluice/sluice.example.toml

# target/debian/sluice_VERSION_ARCH.deb from a fresh release build.
deb: build
	@$(MAKE) --no-print-directory package-deb

# The package from the release build already in target/release: `make
# install` staged into DEBDIR/root, packed by packaging/debian/build-deb.
DEBDIR ?= $(CURDIR)/target/debian
package-deb:
	@command -v dpkg-shlibdeps >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq dpkg-dev; } \
		|| { echo "building the package needs dpkg-dev (apt-get install dpkg-dev)" >&2; exit 1; }
	rm -rf $(DEBDIR)/root
	$(MAKE) --no-print-directory install DESTDIR=$(DEBDIR)/root GEN=$(DEBDIR)/generated PREFIX=/usr UNITDIR=/lib/systemd/system
	packaging/debian/build-deb $(DEBDIR)/root $(DEBDIR)

clean:
	$(CARGO) clean
