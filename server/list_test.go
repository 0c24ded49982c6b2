package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// TestHTTPListPaged: the pages of a list, read while a writer puts and
// deletes keys across the whole range, are together the room at the
// first page's revision; each page holds at most limit keys.
func TestHTTPListPaged(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	for i := 0; i < 300; i += 100 {
		var ops []store.Op
		for j := i; j < i+100; j++ {
			ops = append(ops, store.Op{Type: store.OpPut, Key: fmt.Sprintf("k/%03d", j), Value: []byte(fmt.Sprint(j))})
		}
		if _, err := e.eng.Apply(context.Background(), "p", store.Write{Ops: ops}); err != nil {
			t.Fatal(err)
		}
	}
	fillRoom(t, e, "c", 2500, 10) // for the client: more than a page
	want := e.list(t, "p", "")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { // writes under the pages as they are read
		rnd := rand.New(rand.NewPCG(3, 4))
		for i := 0; i < 2000 && ctx.Err() == nil; i++ {
			k, room := fmt.Sprintf("k/%03d", rnd.IntN(320)), []string{"p", "c"}[i%2]
			var err error
			if rnd.IntN(3) == 0 {
				_, err = e.eng.Apply(ctx, room, store.Write{Ops: []store.Op{{Type: store.OpDelete, Key: k}}})
			} else {
				_, err = e.eng.Apply(ctx, room, store.Put(k, []byte(`"w"`)))
			}
			if err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
		}
	})
	defer wg.Wait()
	defer cancel()

	var got []apiItem
	q := url.Values{"limit": {"17"}, "rev": {fmt.Sprint(want.Rev)}} // the revision of want, however far the writer got
	for pages := 0; ; pages++ {
		var p struct {
			apiList
			More bool   `json:"more"`
			Next string `json:"next"`
		}
		e.do(t, "GET", "/v1/rooms/p/kv?"+q.Encode(), "").want(t, 200, &p)
		if p.Rev != want.Rev || p.Epoch != want.Epoch || len(p.Items) > 17 || pages > 100 {
			t.Fatalf("page %d at %s/%d with %d items, want %s/%d and at most 17", pages, p.Epoch, p.Rev, len(p.Items), want.Epoch, want.Rev)
		}
		got = append(got, p.Items...)
		if !p.More {
			break
		}
		q.Set("after", p.Next)
	}
	if diff := cmp.Diff(want.Items, got); diff != "" {
		t.Fatalf("the pages differ from the room at rev %d (-want +got):\n%s", want.Rev, diff)
	}

	// The Go client follows the pages: its list is the room at one
	// revision, whatever the writer does meanwhile.
	h := &client.HTTP{URL: e.hs.URL, Client: e.client}
	l, err := h.List(ctx, "c", "k/")
	if err != nil {
		t.Fatal(err)
	}
	at, err := e.eng.ListPage(ctx, "c", "k/", rooms.PageOptions{Rev: l.Rev}, rooms.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != len(at.Items) || len(l.Items) < 2500 || l.Items[len(l.Items)-1].Key != at.Items[len(at.Items)-1].Key {
		t.Fatalf("client list of %d keys, want the %d keys at rev %d", len(l.Items), len(at.Items), l.Rev)
	}
}

// TestHTTPListTooLarge: a list larger than a reply may be is refused
// with 413 too_large unless paged, and its pages are bounded in bytes.
func TestHTTPListTooLarge(t *testing.T) {
	e := newAPIEnv(t, apiOpts{})
	fillRoom(t, e, "big", 9000, 500) // about 5 MiB
	e.do(t, "GET", "/v1/rooms/big/kv", "").wantErr(t, 413, "too_large")
	var p struct {
		apiList
		More bool `json:"more"`
	}
	r := e.do(t, "GET", "/v1/rooms/big/kv?limit=10000", "")
	r.want(t, 200, &p)
	if !p.More || len(r.body) > maxListBytes+maxListBytes/4 || len(p.Items) == 0 {
		t.Fatalf("a page of %d keys, %d bytes, more %v: want more and at most about %d bytes", len(p.Items), len(r.body), p.More, maxListBytes)
	}
	e.do(t, "GET", "/v1/rooms/big/kv?limit=0", "").wantErr(t, 400, "bad_request")
	e.do(t, "GET", "/v1/rooms/big/kv?limit=10&rev=999999", "").wantErr(t, 400, "bad_request")
}
