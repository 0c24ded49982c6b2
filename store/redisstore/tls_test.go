package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

func TestCutTLSParams(t *testing.T) {
	clean, f, err := cutTLSParams("rediss://u:p@h:6380/2?tls_ca_cert_file=/a/ca.pem&dial_timeout=3s&tls_cert_file=c.pem&tls_key_file=c.key")
	if err != nil || clean != "rediss://u:p@h:6380/2?dial_timeout=3s" || f != (tlsFiles{"/a/ca.pem", "c.pem", "c.key"}) {
		t.Errorf("got %q %+v %v", clean, f, err)
	}
	if clean, f, err := cutTLSParams("rediss://h:1/0?tls_ca_cert_file=ca.pem"); err != nil || clean != "rediss://h:1/0" || f.ca != "ca.pem" {
		t.Errorf("CA alone: %q %+v %v", clean, f, err)
	}
	if _, _, err := cutTLSParams("rediss://h:1/0?tls_cert_file=c.pem"); err == nil {
		t.Error("a certificate without its key: no error")
	}
	// Files for a URL without TLS would go unused: refused.
	if _, err := New(context.Background(), Config{URL: "redis://127.0.0.1:1/0?tls_ca_cert_file=ca.pem"}); err == nil || !strings.Contains(err.Error(), "does not use TLS") {
		t.Errorf("TLS files on redis://: %v", err)
	}
	if _, err := New(context.Background(), Config{URL: "rediss://127.0.0.1:1/0?tls_ca_cert_file=/nonexistent/ca.pem"}); err == nil || !strings.Contains(err.Error(), "tls_ca_cert_file") {
		t.Errorf("a CA file that does not exist: %v", err)
	}
}

// TestTLS: a store on a redis-server that serves TLS only with its own CA
// and asks for client certificates (redis.conf's default), given the
// files in its URL; without the client certificate it is refused; a
// Cluster of TLS masters; and through Sentinels on TLS too, a write acknowledged by a replica survives
// the master's death.
func TestTLS(t *testing.T) {
	tc := redistest.NewTLS(t)
	srv := redistest.Start(t, redistest.Options{TLS: tc})
	if !strings.HasPrefix(srv.URL(), "rediss://") {
		t.Fatalf("URL %s", srv.URL())
	}
	s := openStore(t, srv.URL(), nil)
	res := mustApply(t, s, "tls", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte(`"v"`)}}})
	got := make(chan store.Batch, 4)
	stop, err := s.Follow("tls", func(b store.Batch) { got <- b })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mustApply(t, s, "tls", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte(`"w"`)}}})
	select {
	case b := <-got:
		if b.Rev != res.Rev+1 {
			t.Errorf("followed batch at %d, want %d", b.Rev, res.Rev+1)
		}
	case <-time.After(5 * time.Second):
		t.Error("no batch pushed over TLS")
	}

	noCert := "rediss://" + srv.Addr() + "/0?tls_ca_cert_file=" + tc.CA
	if st, err := New(context.Background(), Config{URL: noCert}); err == nil {
		_ = st.Close()
		t.Error("a client without a certificate was let in")
	}

	// A Cluster of 3 TLS masters (its bus on TLS too): rooms over every
	// master, and the pushes of each.
	cl := redistest.StartTLSCluster(t, 3, tc)
	cs := openStore(t, cl.URL(), func(c *Config) { c.Cluster = true })
	for i := range 6 {
		room := fmt.Sprint("tls-", i)
		r := mustApply(t, cs, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte(`1`)}}})
		pushed := make(chan store.Batch, 4)
		stop, err := cs.Follow(room, func(b store.Batch) { pushed <- b })
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, cs, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte(`2`)}}})
		select {
		case b := <-pushed:
			if b.Rev != r.Rev+1 {
				t.Errorf("cluster room %s: batch at %d, want %d", room, b.Rev, r.Rev+1)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("cluster room %s: no batch pushed over TLS", room)
		}
		stop()
	}

	f := redistest.StartFailover(t, 1, 1, time.Second, redistest.Options{TLS: tc})
	if !strings.HasPrefix(f.URL(), "rediss+sentinel://") {
		t.Fatalf("URL %s", f.URL())
	}
	fs := openStore(t, f.URL(), func(c *Config) { c.MinReplicas = 1 })
	before := mustApply(t, fs, "tls", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte(`"acked"`)}}})
	master, err := f.Master()
	if err != nil {
		t.Fatal(err)
	}
	master.Kill()
	if _, err := f.WaitPromoted(master, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		snap, err := fs.Snapshot(ctx, "tls", "")
		if err == nil {
			if len(snap.Items) != 1 || string(snap.Items[0].Value) != `"acked"` || snap.Rev != before.Rev || snap.Epoch != before.Epoch {
				t.Errorf("after the failover: %+v, want k=\"acked\" at %d in epoch %s", snap, before.Rev, before.Epoch)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no read after the failover: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
