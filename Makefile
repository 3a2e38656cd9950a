# idem — the one command CI runs is `make test`.
SHELL := /bin/bash
GO ?= go
SQLC_CONFIGS := $(shell find . -name sqlc.yaml -not -path './.git/*' -not -path './.release/*' -not -path './.bin/*' | sort)
PKGS := ./...
# Integrations with heavy dependencies (kafka-go, nats.go, go-redis,
# OpenTelemetry, Prometheus), the reference service and the programs are Go
# modules of their own, so that a user of the core downloads none of them.
# go.work joins them for development: `./...` still means the root module
# only, so ALL_PKGS names every module's tree, and one go invocation
# schedules all their packages together. tools/ is the tool module (sqlc,
# staticcheck), built once into .bin/ outside the workspace.
MODULES := . examples/billing examples/orm examples/quickstart cmd kafkago natsjs otel prom redisstore idemgin idemecho idemgrpc idemfiber idemconnect
ALL_PKGS := ./... $(foreach m,$(filter-out .,$(MODULES)),./$(m)/...)
BIN := $(CURDIR)/.bin

.PHONY: help test fmt-check tidy-check release-check vet staticcheck sqlc-check gotest generate bench tools mutants chaos-matrix

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: fmt-check tidy-check release-check vet staticcheck sqlc-check gotest ## everything CI checks

fmt-check: ## fail if gofmt would change a file
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

tidy-check: tools ## fail if any module's go.mod or go.sum is not tidy (the repository's modules come from the rehearsal proxy)
	$(BIN)/release -root . tidy-check

release-check: tools ## the release rehearsal (docs/releasing.md): no replace, go install of the programs, a fresh consumer of every library
	cd tools && GOWORK=off $(GO) test -count=1 ./release/
	$(BIN)/release -root . rehearse

tools: ## build sqlc and staticcheck, pinned in tools/go.mod, into .bin/
	@cd tools && GOWORK=off $(GO) build -o $(BIN)/ github.com/sqlc-dev/sqlc/cmd/sqlc honnef.co/go/tools/cmd/staticcheck ./release

vet: ## go vet, every module
	$(GO) vet $(ALL_PKGS)

staticcheck: tools ## staticcheck, every module
	$(BIN)/staticcheck $(ALL_PKGS)

sqlc-check: tools ## fail if sqlc-generated code is stale
	@for f in $(SQLC_CONFIGS); do \
		echo "sqlc diff -f $$f"; $(BIN)/sqlc diff -f $$f || { echo "generated code is stale: run make generate"; exit 1; }; \
	done

gotest: ## go test -race with goleak in every package, every module
	$(GO) test -race -count=1 -timeout 25m $(ALL_PKGS)

mutants: ## the proof's mutation test alone (gotest runs it too): every deliberate bug must fail billing chaos
	$(GO) test -count=1 -v -timeout 15m ./examples/billing/chaos/mutants/

chaos-matrix: ## billing chaos --matrix: the short profile over every broker x outbox x store (gotest runs one row per axis)
	$(GO) run ./cmd/billing chaos --matrix

generate: tools ## regenerate sqlc code
	@for f in $(SQLC_CONFIGS); do echo "sqlc generate -f $$f"; $(BIN)/sqlc generate -f $$f || exit 1; done

bench: ## idem bench for every scenario (needs PostgreSQL)
	$(GO) run ./cmd/idem bench http
	$(GO) run ./cmd/idem bench relay
	$(GO) run ./cmd/idem bench inbox
