module github.com/statecast/statecast

go 1.26

require (
	github.com/google/btree v1.1.3
	github.com/google/go-cmp v0.7.0
	go.etcd.io/bbolt v1.5.0
	go.uber.org/goleak v1.3.0
	pgregory.net/rapid v1.3.0
)

require golang.org/x/sys v0.45.0 // indirect
