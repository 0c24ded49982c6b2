// Package redisstore is the store.Store on Redis or Redis Cluster: rooms
// that many nodes share. Open one with New; besides store.Store it
// implements store.Heads, store.SharedSessions, store.Nodes and
// store.SharedLeases, which the engine and the server discover by type
// assertion.
//
// Its design (the key layout, one script per write, retention, reads,
// epochs, how a node follows a room and recovers what pub/sub lost) is
// docs/DESIGN.md#several-nodes-on-redis; the lock order is docs/LOCKS.md.
// The files:
//
//   - store.go: New, Config, writes (Apply), snapshots, history, Leased
//   - commit.go: group commit of writes, one pipeline per master and round trip
//   - follow.go: Follow and store.Heads (sharded pub/sub, the stream, the check)
//   - codec.go: the key record and batch encodings that apply.lua writes
//   - sessions.go, leases.go, nodes.go: session records, TTL leases, the node registry
//   - lua/: the scripts of a write, a first read, the read-time trim and a new epoch
//
// Its tests run the storetest conformance suite on a standalone Redis and
// on a Cluster (conformance_test.go), and inject what the suite cannot:
// failures of Redis, lost pushes, epochs (store_test.go). Each starts its
// own redis-server (store/redistest).
package redisstore
