# statecast: `make run` starts the server, `make test` runs every test.
GO ?= go

.PHONY: run test bench-smoke test-sdk bench vet screenshots soak

run:
	$(GO) run ./cmd/statecast serve

# Every test: Go under the race detector; then, side by side (make -j2,
# output kept apart), each Go benchmark run once as a smoke test and the
# TypeScript SDK (unit tests, the real server, bundle size); then the demo
# in real Chromium (demo/e2e). The benchmarks get a run of their own
# because `go test -bench` runs every package's tests one package at a
# time; without -race, which the tests above already ran over the same
# code; and -short shrinks the scenario benchmarks whose one op is seconds
# of load. -p 4: the multi-node tests mostly wait on processes and timers,
# so four packages run at once; -timeout 20m, as one package may take
# longer than go test's default 10 minutes on a loaded machine. The tests that run the statecast binary
# build it as the Dockerfile does, so that variant is compiled once too.
# Without CI=true, tests whose tool is missing (redis-server, etcdctl,
# Chromium) are skipped; each notes it in $(SKIPPED), listed at the end,
# so that a green run says what it did not check.
BENCH_PKGS = $(addprefix ./,$(sort $(dir $(shell git grep -l '^func Benchmark' -- '*_test.go'))))
SKIPPED = $(CURDIR)/.test-skipped
export STATECAST_SKIPPED = $(SKIPPED)
test: vet
	@rm -f $(SKIPPED)
	$(GO) test -race -count=1 -p 4 -timeout 20m ./...
	$(MAKE) --no-print-directory -j2 -Otarget bench-smoke test-sdk
	cd demo && npm ci --no-audit --no-fund --loglevel=error && npm test
	@if [ -s $(SKIPPED) ]; then echo; echo "make test: passed, but skipped for a missing tool (install it, or run with CI=true to fail instead):"; sort -u $(SKIPPED) | sed 's/^/  - /'; else echo "make test: passed; nothing skipped"; fi

bench-smoke:
	$(GO) test -count=1 -short -run '^$$' -bench . -benchtime 1x $(BENCH_PKGS)

test-sdk:
	cd sdk-js && npm ci --no-audit --no-fund --loglevel=error && npm test

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# The demo's screenshots (README), taken by the demo's browser tests.
screenshots:
	cd demo && npm ci --no-audit --no-fund --loglevel=error && SCREENSHOTS_DIR=$(CURDIR)/demo/screenshots npm test

# The Go benchmarks' figures (docs/BENCHMARKS.md).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./rooms ./store/... ./server/hooks

# The multi-node chaos soaks (not part of `make test`), each for $(SOAK):
# TestSoak: 3 nodes on one redis-server, node kills and restarts, cut Redis
# connections, dropped pushes, Redis restarts, FLUSHALL, in a loop; it reports
# writes, deliveries, resyncs and divergences (which must be 0).
# TestLinearizableSoak: rounds of GET/PUT/CAS/DELETE by 6 clients on random
# nodes under node kills, Redis cuts and Redis restarts, each round's history
# checked linearizable with porcupine.
# TestFailoverSoak: the same check on 3 nodes on a Sentinel-watched master
# with 2 replicas, the master SIGKILLed twice a round and rejoined as a
# replica, and failovers to a replica cut off before the last writes (they are
# lost), rounds alternating --redis-min-replicas 1 and 0.
# TestWebhooksUnderReceiverAndNodeFaults: with the webhook receiver down for
# 30 s (2 s in make test).
SOAK ?= 3m
soak:
	CI=true $(GO) test -race -count=1 -v -run '^(TestSoak|TestLinearizableSoak|TestFailoverSoak|TestWebhooksUnderReceiverAndNodeFaults)$$' -timeout 60m ./cmd/statecast -soak $(SOAK)
