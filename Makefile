# statecast: `make run` starts the server, `make test` runs every test.
GO ?= go

.PHONY: run test bench vet

run:
	$(GO) run ./cmd/statecast serve

# Every test, under the race detector, then each benchmark once as a smoke test.
test: vet
	$(GO) test -race -count=1 ./...
	$(GO) test -run '^$$' -bench . -benchtime 1x ./...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }
	$(GO) vet ./...

# The figures in the README.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 3 ./rooms ./store
