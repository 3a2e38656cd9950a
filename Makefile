# idem — the one command CI runs is `make test`.
SHELL := /bin/bash
GO ?= go
SQLC_CONFIGS := $(shell find . -name sqlc.yaml -not -path './.git/*' | sort)
PKGS := ./...
# The adapter modules with heavy dependencies (kafka-go, nats.go, go-redis) are Go
# modules of their own: `go test ./...` at the root does not enter them, so
# vet, staticcheck and gotest run once per module. tools/ is the tool
# module, not tested.
MODULES := . kafkago natsjs otel prom redisstore

.PHONY: help test fmt-check tidy-check vet staticcheck sqlc-check gotest generate bench mutants

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: fmt-check tidy-check vet staticcheck sqlc-check gotest ## everything CI checks

fmt-check: ## fail if gofmt would change a file
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

tidy-check: ## fail if any module's go.mod or go.sum is not tidy
	@for m in $$(find . -name go.mod -not -path './.git/*' | sort); do \
		d=$$(dirname $$m); echo "go mod tidy -diff ($$d)"; (cd $$d && $(GO) mod tidy -diff) || { echo "$$d: run go mod tidy"; exit 1; }; \
	done

vet: ## go vet, every module
	@for m in $(MODULES); do echo "go vet ($$m)"; (cd $$m && $(GO) vet $(PKGS)) || exit 1; done

staticcheck: ## staticcheck, pinned in tools/go.mod, every module
	@for m in $(MODULES); do echo "staticcheck ($$m)"; \
		(cd $$m && $(GO) tool -modfile=$(CURDIR)/tools/go.mod staticcheck $(PKGS)) || exit 1; done

sqlc-check: ## fail if sqlc-generated code is stale
	@for f in $(SQLC_CONFIGS); do \
		echo "sqlc diff -f $$f"; $(GO) tool -modfile=tools/go.mod sqlc diff -f $$f || { echo "generated code is stale: run make generate"; exit 1; }; \
	done

gotest: ## go test -race with goleak in every package, every module
	@for m in $(MODULES); do echo "go test ($$m)"; (cd $$m && $(GO) test -race -count=1 -timeout 25m $(PKGS)) || exit 1; done

mutants: ## the proof's mutation test alone (gotest runs it too): every deliberate bug must fail billing chaos
	$(GO) test -count=1 -v -timeout 15m ./examples/billing/chaos/mutants/

generate: ## regenerate sqlc code
	@for f in $(SQLC_CONFIGS); do echo "sqlc generate -f $$f"; $(GO) tool -modfile=tools/go.mod sqlc generate -f $$f || exit 1; done

bench: ## idem bench for every scenario (needs PostgreSQL)
	$(GO) run ./cmd/idem bench http
	$(GO) run ./cmd/idem bench relay
	$(GO) run ./cmd/idem bench inbox
