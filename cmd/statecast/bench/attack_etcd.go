package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Attacks on the etcd v3 API of the server (its --etcd-addr, given as
// --etcd-addr here). The sizes are those of the findings they replay;
// --attack-conns scales them.

// etcdConn dials the etcd API as etcd's clients do (replies of any size
// accepted); small windows make a client that does not read hold the
// server's sends up at once.
func (e *env) etcdConn(smallWindows bool, more ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32))}, more...)
	if smallWindows {
		opts = append(opts, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	}
	return grpc.NewClient(e.cfg.etcdAddr, opts...)
}

// etcdFill puts keys values of size bytes under /room/ through the etcd
// API; etcd bytes, stored as a JSON string each. A put over the write rate
// (which charges a large value by its bytes) waits and goes again.
func (e *env) etcdFill(ctx context.Context, kv pb.KVClient, room string, keys, size int) error {
	value := []byte(strings.Repeat("x", size))
	for i := 0; i < keys; i++ {
		_, err := kv.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "/%s/k%04d", room, i), Value: value})
		switch {
		case status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "writes per second"):
			i--
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		case err != nil:
			return fmt.Errorf("put %d: %w", i, err)
		}
	}
	return nil
}

// codeOf names a gRPC reply for the counts.
func codeOf(err error) string {
	if err == nil {
		return "OK"
	}
	return status.Code(err).String()
}

// attackEtcdTxnRanges: --attack-conns clients at once, each sending one
// Txn of 128 ranges (etcd's most ops), each range the whole of a 2 MiB
// room: 256 MiB of reply per 2.6 KiB request.
func (e *env) attackEtcdTxnRanges(ctx context.Context, rep *attackReport) error {
	n := e.cfg.attackConns
	room := attackRoom("etcd-txn")
	rep.Params = fmt.Sprintf("%d concurrent txns of 128 ranges over a room of 8 × 256,000-byte values", n)
	conn, err := e.etcdConn(false)
	if err != nil {
		return err
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	if err := e.etcdFill(rctx, pb.NewKVClient(conn), room, 8, 256_000); err != nil {
		return err
	}
	txn := &pb.TxnRequest{}
	for range 128 {
		r := &pb.RangeRequest{Key: []byte("/" + room + "/"), RangeEnd: []byte("/" + room + "0")}
		txn.Success = append(txn.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}})
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr string
	var replied atomic.Int64
	t := time.Now()
	for range n {
		wg.Add(1)
		go func() { // a connection each, as separate clients
			defer wg.Done()
			c, err := e.etcdConn(false)
			if err == nil {
				defer c.Close()
				var resp *pb.TxnResponse
				if resp, err = pb.NewKVClient(c).Txn(rctx, txn); err == nil {
					replied.Add(int64(len(resp.Responses)))
				}
			}
			rep.count("txn "+codeOf(err), 1)
			if err != nil {
				mu.Lock()
				if firstErr == "" {
					firstErr = err.Error()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	rep.outcome("%d txns answered in %.2f s: %d OK (%d ranges replied)", n, time.Since(t).Seconds(), rep.Counts["txn OK"], replied.Load())
	if firstErr != "" {
		rep.outcome("refused: %s", firstErr)
	}
	return nil
}

// attackEtcdWatchNoRead: --attack-conns connections, each with 256
// watches with prev_kv on one stream, never reading, while 300 puts of
// 200 KiB go by; then whether the server still holds them.
func (e *env) attackEtcdWatchNoRead(ctx context.Context, rep *attackReport) error {
	n := e.cfg.attackConns
	const watches, writes, size = 256, 300, 200 << 10
	room := attackRoom("etcd-watch")
	rep.Params = fmt.Sprintf("%d connections × %d watches with prev_kv that never read, %d puts of %d bytes", n, watches, writes, size)
	rctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var streams []pb.Watch_WatchClient
	for range n {
		c, err := e.etcdConn(true)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		ws, err := pb.NewWatchClient(c).Watch(rctx)
		if err != nil {
			return err
		}
		for range watches {
			cr := &pb.WatchCreateRequest{Key: []byte("/" + room + "/"), RangeEnd: []byte("/" + room + "0"), PrevKv: true}
			if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}}); err != nil {
				return fmt.Errorf("watch create: %w", err)
			}
			if resp, err := ws.Recv(); err != nil || !resp.Created || resp.Canceled {
				return fmt.Errorf("watch create: %v %v", resp, err)
			}
		}
		streams = append(streams, ws)
	}
	// The writer writes from an address of its own (127.0.0.2), so its
	// write budget is not the bystander's (anonymous clients share their
	// address's).
	writer, err := e.etcdConn(false, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext(ctx, "tcp", addr)
	}))
	if err != nil {
		return err
	}
	defer writer.Close()
	t := time.Now()
	if err := e.etcdFill(rctx, pb.NewKVClient(writer), room, writes, size); err != nil {
		return err
	}
	rep.outcome("%d watches created on %d connections; %d puts of %d KiB in %.2f s", n*watches, n, writes, size>>10, time.Since(t).Seconds())
	// What each stream gets in 3 s once it reads again: its watches were
	// held, caught up, or ended.
	open := 0
	for _, ws := range streams {
		got := make(chan error, 1)
		go func() {
			_, err := ws.Recv()
			got <- err
		}()
		select {
		case err := <-got:
			if err == nil {
				open++
			} else {
				rep.count("stream ended: "+codeOf(err), 1)
			}
		case <-time.After(3 * time.Second):
			rep.count("stream silent", 1)
		}
	}
	rep.count("stream still sending", open)
	rep.outcome("%d of %d streams still sending when read again", open, n)
	return nil
}

// attackEtcdIdle: --attack-conns TCP connections to the etcd API that
// send nothing, held up to --attack-hold: how many the server closes,
// and when.
func (e *env) attackEtcdIdle(ctx context.Context, rep *attackReport) error {
	n, hold := e.cfg.attackConns, e.cfg.attackHold
	rep.Params = fmt.Sprintf("%d connections to the etcd API that send nothing, held up to %v", n, hold)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var cuts []time.Duration
	var open atomic.Int64
	d := net.Dialer{Timeout: 5 * time.Second}
	for range n {
		c, err := d.DialContext(ctx, "tcp", e.cfg.etcdAddr)
		if err != nil {
			rep.count("connection refused or failed", 1)
			continue
		}
		rep.count("connection opened", 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			t := time.Now()
			_ = c.SetReadDeadline(t.Add(hold))
			buf := make([]byte, 4096)
			for {
				_, err := c.Read(buf) // the server's settings frame, then nothing
				var ne net.Error
				switch {
				case errors.As(err, &ne) && ne.Timeout():
					open.Add(1)
					return
				case err != nil:
					mu.Lock()
					cuts = append(cuts, time.Since(t))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(cuts) > 0 {
		slices.Sort(cuts)
		rep.outcome("%d closed by the server after %.1f s (median), %.1f s (max)", len(cuts), cuts[len(cuts)/2].Seconds(), cuts[len(cuts)-1].Seconds())
	}
	rep.outcome("%d of %d still open after %v", open.Load(), rep.Counts["connection opened"], hold)
	rep.count("closed by the server", len(cuts))
	rep.count("still open at the end", int(open.Load()))
	return nil
}
