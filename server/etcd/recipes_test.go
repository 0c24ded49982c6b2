package etcd_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/statecast/statecast/server/servertest"
)

// The etcd client's own recipes (client/v3/concurrency) in-process; the
// contended suite runs against the built binary in cmd/statecast.

// TestTxnRangeSeesTheCommittedState: the lock recipe's txn, put my key
// then read the oldest key of the prefix, from several clients at once.
// Each answer must read the state the txn committed on: nobody is
// created before the owner it reports, and all report the same one.
func TestTxnRangeSeesTheCommittedState(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	const rounds, clients = 15, 4
	for round := range rounds {
		prefix := fmt.Sprintf("/lock/r%d/", round)
		owners := make([]int64, clients) // the owner's create revision each saw
		mine := make([]int64, clients)
		errs := make([]error, clients)
		begin := make(chan struct{})
		var wg sync.WaitGroup
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-begin
				key := prefix + strconv.Itoa(i)
				resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, "x"), clientv3.OpGet(prefix, append(clientv3.WithFirstCreate(), clientv3.WithPrefix())...)).
					Commit()
				if err != nil {
					errs[i] = err
					return
				}
				kvs := resp.Responses[1].GetResponseRange().Kvs
				if len(kvs) != 1 {
					errs[i] = fmt.Errorf("the range found %d keys, want the oldest", len(kvs))
					return
				}
				owners[i], mine[i] = kvs[0].CreateRevision, resp.Header.Revision
			}()
		}
		close(begin)
		wg.Wait()
		first := mine[0]
		for i := range clients {
			if errs[i] != nil {
				t.Fatalf("round %d, client %d: %v", round, i, errs[i])
			}
			first = min(first, mine[i])
		}
		for i := range clients {
			if owners[i] != first {
				t.Fatalf("round %d: client %d (committed at %d) saw the owner created at %d; the first key was created at %d", round, i, mine[i], owners[i], first)
			}
		}
	}
}

// TestElectionOnAFreshRoom: a campaign that is a room's first write
// wins, and an observer sees the leader (etcd's first write is revision
// 2: a leader at 1 waited forever for a key created before it).
func TestElectionOnAFreshRoom(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e := concurrency.NewElection(s, "/fresh/election")
	if err := e.Campaign(ctx, "leader-1"); err != nil {
		t.Fatalf("campaign on a fresh room: %v", err)
	}
	obs := concurrency.NewElection(s, "/fresh/election").Observe(ctx)
	select {
	case resp := <-obs:
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "leader-1" {
			t.Fatalf("observed %v", resp.Kvs)
		}
	case <-ctx.Done():
		t.Fatal("the observer saw no leader")
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	for range obs { // the observer ends with its context
	}
}

// TestSTMReadsTwoKeys: an STM body reading two keys commits at every
// isolation level (its second read names the first read's revision).
func TestSTMReadsTwoKeys(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	for _, iso := range []concurrency.Isolation{concurrency.SerializableSnapshot, concurrency.Serializable, concurrency.RepeatableReads, concurrency.ReadCommitted} {
		t.Run(strconv.Itoa(int(iso)), func(t *testing.T) {
			room := "/stm" + strconv.Itoa(int(iso)) + "/"
			if _, err := cli.Put(ctx, room+"a", "1"); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Put(ctx, room+"b", "2"); err != nil {
				t.Fatal(err)
			}
			_, err := concurrency.NewSTM(cli, func(stm concurrency.STM) error {
				a, _ := strconv.Atoi(stm.Get(room + "a"))
				b, _ := strconv.Atoi(stm.Get(room + "b"))
				stm.Put(room+"sum", strconv.Itoa(a+b))
				return nil
			}, concurrency.WithIsolation(iso), concurrency.WithAbortContext(ctx))
			if err != nil {
				t.Fatalf("stm: %v", err)
			}
			if get, err := cli.Get(ctx, room+"sum"); err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "3" {
				t.Fatalf("sum: %v, %v", get, err)
			}
		})
	}
}
