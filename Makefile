# gpuhost — the two commands a newcomer needs: `make demo` and `make test`.
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
BIN      := bin/gpuhost
# go.mod names go1.27.3 (go1.26.8 has reachable stdlib vulnerabilities); the go
# command fetches that toolchain from the module proxy on first use.
export GOTOOLCHAIN := go1.27.3
# cgo (a C compiler, gcc) is needed only by go-nvml for the real driver
# (build-gpu, install) and by the race detector (test, vet). The demo binary
# is built without it: the !cgo NVML stub leaves the simulated GPU.
export CGO_ENABLED ?= 1
# Static checkers, pinned and run through `go run` (fetched from the module
# proxy on first use; nothing to install).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# gotestsum runs go test -json and ends with a summary of the skipped tests
# and their reasons (fetched from the module proxy on first use).
GOTESTSUM ?= $(GO) run gotest.tools/gotestsum@v1.13.0
# nfpm builds the Debian package (fetched from the module proxy on first use).
NFPM ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
DEB_DIR  ?= bin/deb
# The real-Ollama tests run against the default release (bench/ollamatest's
# Versions[0]) in the whole suite, then once more against the newest one
# that can be built and run here (see docs/development-and-ci.md).
OLLAMA_NEWEST ?= 0.24.0
REAL_OLLAMA_TESTS := ^(TestStart|TestSwitchToRealOllama|TestRealOllama.*|TestAgentAPIsUsageRealOllama)$$
# A Debian version must start with a digit: the commit count orders builds.
DEB_VERSION ?= 0.0.0+git$(shell git rev-list --count HEAD 2>/dev/null || echo 0).$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
DEB_ARCH ?= $(shell dpkg --print-architecture 2>/dev/null || $(GO) env GOARCH)
DEB_MAINTAINER ?= gpuhost maintainers <maintainers@users.noreply.a-seed-9a04c88b.example>

.PHONY: all build build-gpu deb demo test test-short vet vulncheck fmt bench fuzz install uninstall clean promtool

all: build

## build: bin/gpuhost without cgo (no C compiler; simulated GPU only, NVML reports unavailable)
build:
	@echo ">> go toolchain $(GOTOOLCHAIN): fetched from the Go module proxy on first use (once; a minute or more)"
	@$(GO) version
	@echo ">> modules: go mod download (from the module proxy on first use, then cached)"
	@$(GO) mod download
	@echo ">> building $(BIN) without cgo (a cold build compiles every dependency: a few minutes on 2 cores)"
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) .

## build-gpu: bin/gpuhost with cgo for a real NVIDIA driver (needs gcc); what install and scripts/gpu-smoke.sh use
build-gpu:
	CGO_ENABLED=1 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) .

## deb: $(DEB_DIR)/gpuhost_VERSION_ARCH.deb with nfpm: the cgo binary, every unit `units render --example` writes, the example config as a conffile
# The binary is build-gpu's, as a stripped PIE (Debian's hardening and lintian want both).
# Not -z now (lintian's hardening-no-bindnow): go-nvml leaves the NVML symbols
# unresolved until first use, so immediate binding fails at start-up.
# DEB_BINARY=path packages that binary instead of building one (the
# installed-box test packages one build twice, as two versions).
deb:
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/units
	$(if $(DEB_BINARY),cp $(DEB_BINARY) $(DEB_DIR)/gpuhost,CGO_ENABLED=1 $(GO) build -buildmode=pie -ldflags "$(LDFLAGS) -s -w" -o $(DEB_DIR)/gpuhost .)
	$(DEB_DIR)/gpuhost units render --example --binary /usr/bin/gpuhost --config /etc/gpuhost/gpuhost.yaml --dir $(DEB_DIR)/units
	gzip -9n < packaging/changelog > $(DEB_DIR)/changelog.gz
	sed -e 's|@BIN@|$(DEB_DIR)/gpuhost|g' -e 's|@STAGE@|$(DEB_DIR)|g' -e 's|@VERSION@|$(DEB_VERSION)|g' \
	  -e 's|@ARCH@|$(DEB_ARCH)|g' -e 's|@MAINTAINER@|$(DEB_MAINTAINER)|g' packaging/nfpm.yaml > $(DEB_DIR)/nfpm.yaml
	$(NFPM) package --config $(DEB_DIR)/nfpm.yaml --packager deb --target $(DEB_DIR)/

## demo: the main job on the embedded default (simulated GPU and backends; no GPU, root, systemd or C compiler)
demo: build
	@echo ">> starting the demo: ./$(BIN) demo"
	./$(BIN) demo

## test: vet and staticcheck, gofmt check, the Prometheus rule tests, and the whole suite with the race detector (needs gcc); ends with the skipped tests and why
test: vet promtool
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	CGO_ENABLED=1 $(GOTESTSUM) --format pkgname-and-test-fails --format-hide-empty-pkg -- -race -count=1 -timeout 20m ./...
	@echo ">> the real-Ollama tests again against Ollama $(OLLAMA_NEWEST), the newest release that builds and runs models here"
	GPUHOST_OLLAMA_VERSION=$(OLLAMA_NEWEST) CGO_ENABLED=1 $(GOTESTSUM) --format pkgname-and-test-fails --format-hide-empty-pkg -- \
	  -race -count=1 -timeout 20m -run '$(REAL_OLLAMA_TESTS)' ./bench/ollamatest/ ./appliance/ ./bench/benchcmd/ ./frontdoor/proxy/

## promtool: check deploy/prometheus (config syntax, rules) and run its rule unit tests with promtool
## (Debian package prometheus); skipped loudly without promtool unless GPUHOST_REQUIRE_PROMTOOL=1
promtool:
	@if ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$GPUHOST_REQUIRE_PROMTOOL" = 1 ]; then echo "promtool not found and GPUHOST_REQUIRE_PROMTOOL=1: apt-get install prometheus" >&2; exit 1; fi; \
	  echo "#### SKIPPED: the Prometheus rule tests (deploy/prometheus): promtool not found (apt-get install prometheus) ####"; \
	else \
	  set -e; cd deploy/prometheus; \
	  promtool check config --syntax-only prometheus.yml; \
	  promtool check rules recording.rules.yml alerts.rules.yml; \
	  promtool test rules rules_test.yml; \
	fi

vet:
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) vet ./nvml/...
	$(GO) run $(STATICCHECK) ./...

## vulncheck: govulncheck against an offline database built from the pinned golang.org/x/vulndb
vulncheck:
	GO=$(GO) ./scripts/vulncheck.sh

## bench: switch overhead against the bare systemd work (needs root for the private systemd)
bench:
	$(GO) test -run '^$$' -bench . -benchtime 5x -count 1 -timeout 20m ./appliance/...

## fuzz: a short run of every fuzz target
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list 'Fuzz.*' $$pkg | grep ^Fuzz); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 10s $$pkg || exit 1; \
	  done; done

install: build-gpu
	sudo ./scripts/install.sh $(BIN)

uninstall:
	sudo ./scripts/uninstall.sh

clean:
	rm -rf bin
