# sandpod — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
NPM ?= npm
VITEST := npx vitest run
APT_PACKAGES_FILE := .ci/apt-packages.txt

.PHONY: help deps system-deps bench-deps run build test test-unit mutation bench typecheck migrate clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# npm ci installs exactly the lock file, so only a change to it calls for a reinstall (a dependency
# edited in package.json without the lock would fail npm ci anyway).
node_modules/.package-lock.json: package-lock.json
	$(NPM) ci --no-audit --no-fund
	@touch $@

deps: node_modules/.package-lock.json ## Install npm dependencies (npm ci)

# Installs the Debian packages listed in a file (one per line, # comments) that are missing.
define apt_install
	@missing=$$(for p in $$(grep -v '^#' $(1) 2>/dev/null); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing: $$missing"; \
	    (apt-get install -y --no-install-recommends $$missing >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing)); \
	  else echo "missing Debian packages (run as root or: sudo apt-get install $$missing): $(2)"; fi; \
	fi
endef

system-deps: ## Install the Debian packages the sandbox and the console's browser tests need (bubblewrap, runsc, chromium, ...) when missing
	$(call apt_install,$(APT_PACKAGES_FILE),the best sandbox may be unavailable and the console's browser tests skip)

bench-deps: ## Install the benchmark's own tools (wrk) when missing
	$(call apt_install,.ci/bench-packages.txt,the benchmark falls back to its Node load generator)

run: deps system-deps ## Start the service on the embedded default (PGlite + best local sandbox) on :8000; console at /ui (bundled in memory on first use)
	node --import tsx src/main.ts

migrate: deps ## Apply database migrations (SVC_DATABASE_URL or the embedded PGlite)
	node --import tsx src/store/migrate.ts

build: deps ## Compile src/ to dist/ and bundle the console into dist/console/public: what the image runs (node dist/main.js)
	$(NPM) run build

test: deps system-deps ## Run the whole suite: against PostgreSQL, then the database tests again on PGlite
	$(VITEST)
	SANDPOD_TEST_DB=pglite $(VITEST) test/integration/api test/integration/store test/integration/executions

test-unit: deps ## Unit tests only (fast, no sandbox or database)
	$(VITEST) test/unit

# One module (test/mutation/modules.mjs) takes minutes; all of them, hours: not part of `make test`.
MUTATION_MODULES := classify resilience decide request-context egress-proxy claims submission repositories
mutation: deps ## Mutation testing (StrykerJS) of the core modules; MODULE=classify for one (reports/mutation/)
	@for m in $(or $(MODULE),$(MUTATION_MODULES)); do echo "== mutation: $$m"; MODULE=$$m npx stryker run || exit 1; done

bench: deps system-deps bench-deps ## Benchmarks with a report against the bare floor measured in the same run
	npx tsx bench/run.ts

typecheck: deps ## TypeScript strict check (unused locals and parameters included) of src, test, bench, and the console's browser code
	npx tsc -p tsconfig.json --noEmit
	npx tsc -p src/console/web --noEmit

clean: ## Remove the local workspace and build outputs
	rm -rf .workspace dist .bench
