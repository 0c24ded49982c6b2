package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// snapshot-amplify: a room of about snapRoomMB filled with --value-bytes
// values, then snapSubscribers WebSockets subscribing to it at once (each
// gets the room in one snapshot) and snapLists HTTP clients listing it at
// once as the Go client does (?limit=1000, following next; a server
// without paging answers the whole room). Each phase's peak RSS is
// reported beside the attack's.
const (
	snapRoomMB      = 100
	snapSubscribers = 20
	snapLists       = 10
)

func (e *env) attackSnapshotAmplify(ctx context.Context, rep *attackReport) error {
	size := e.cfg.valueBytes
	keys := max(1, snapRoomMB<<20/size)
	room := attackRoom("snap")
	rep.Params = fmt.Sprintf("a room of %d keys of %d-byte values (%.0f MB); %d subscribers at once, then %d HTTP lists at once", keys, size, float64(keys*size)/(1<<20), snapSubscribers, snapLists)
	hc := &http.Client{Timeout: e.cfg.timeout, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: snapLists}}
	value := `"` + strings.Repeat("x", max(size-2, 0)) + `"`
	for i := 0; i < keys; i++ {
		status, err := e.snapPut(ctx, hc, room, i, value)
		switch {
		case err != nil:
			return fmt.Errorf("filling the room: %w", err)
		case status == http.StatusTooManyRequests:
			i--
			_ = sleepCtx(ctx, 20*time.Millisecond)
		case status == http.StatusInsufficientStorage:
			return fmt.Errorf("filling the room: PUT %d: HTTP 507: the room's quota is below this attack's %d MB room: serve with --room-max-bytes 128MiB", i, snapRoomMB)
		case status != http.StatusOK:
			return fmt.Errorf("filling the room: PUT %d: HTTP %d", i, status)
		}
	}
	roomBytes := int64(keys * size)
	rep.outcome("the room filled: server RSS %.0f MB", float64(e.serverRSS())/(1<<20))

	peak := e.peakRSS()
	var wg sync.WaitGroup
	var slowest atomic.Int64
	t0 := time.Now()
	for range snapSubscribers {
		wg.Go(func() {
			if err := e.snapSubscribe(ctx, room, roomBytes/2); err != nil {
				rep.count("subscriber failed", 1)
				return
			}
			rep.count("snapshot received", 1)
			for d := int64(time.Since(t0)); ; {
				if s := slowest.Load(); d <= s || slowest.CompareAndSwap(s, d) {
					break
				}
			}
		})
	}
	wg.Wait()
	rep.outcome("%d/%d subscribers got the snapshot, the last after %.1f s; server peak RSS %.0f MB", rep.Counts["snapshot received"], snapSubscribers, time.Duration(slowest.Load()).Seconds(), peak())

	peak = e.peakRSS()
	var got atomic.Int64
	t0 = time.Now()
	for range snapLists {
		wg.Go(func() {
			n, pages, err := e.snapList(ctx, hc, room)
			if err != nil {
				rep.count("list failed: "+err.Error(), 1)
				return
			}
			got.Add(n)
			rep.count(fmt.Sprintf("list in %d page(s)", pages), 1)
		})
	}
	wg.Wait()
	rep.outcome("%d HTTP lists at once: %d keys listed in %.1f s; server peak RSS %.0f MB", snapLists, got.Load(), time.Since(t0).Seconds(), peak())
	resp, err := hc.Get(e.base + "/v1/rooms/" + room + "/kv")
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		rep.outcome("an unpaged list of the room: HTTP %d", resp.StatusCode)
	}
	return nil
}

// peakRSS samples the server's RSS every samplerEvery until the returned
// func is called, which returns the peak in MB.
func (e *env) peakRSS() func() float64 {
	stop, done := make(chan struct{}), make(chan struct{})
	var peak int64
	go func() {
		defer close(done)
		t := time.NewTicker(samplerEvery)
		defer t.Stop()
		for {
			peak = max(peak, e.serverRSS())
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		return float64(peak) / (1 << 20)
	}
}

func (e *env) snapPut(ctx context.Context, hc *http.Client, room string, i int, value string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, e.base+"/v1/rooms/"+room+"/kv/k"+strconv.Itoa(i), strings.NewReader(value))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// snapSubscribe subscribes to room and reads, discarding, until a
// message of at least n bytes (the snapshot) came.
func (e *env) snapSubscribe(ctx context.Context, room string, n int64) error {
	c, err := e.wsSession(ctx)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	c.SetReadLimit(-1)
	rctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	if err := c.Write(rctx, websocket.MessageText, []byte(`{"t":"sub","id":1,"room":"`+room+`"}`)); err != nil {
		return err
	}
	for {
		_, r, err := c.Reader(rctx)
		if err != nil {
			return err
		}
		got, err := io.Copy(io.Discard, r)
		if err != nil || got >= n {
			return err
		}
	}
}

// snapList lists room as the Go client does and returns the keys and
// pages it got.
func (e *env) snapList(ctx context.Context, hc *http.Client, room string) (keys int64, pages int, err error) {
	q := url.Values{"limit": {"1000"}}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/v1/rooms/"+room+"/kv?"+q.Encode(), nil)
		if err != nil {
			return keys, pages, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return keys, pages, err
		}
		var page struct {
			Rev   uint64            `json:"rev"`
			Items []json.RawMessage `json:"items"`
			More  bool              `json:"more"`
			Next  string            `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return keys, pages, fmt.Errorf("HTTP %d (%v)", resp.StatusCode, err)
		}
		keys += int64(len(page.Items))
		pages++
		if !page.More {
			return keys, pages, nil
		}
		q.Set("after", page.Next)
		q.Set("rev", strconv.FormatUint(page.Rev, 10))
	}
}
