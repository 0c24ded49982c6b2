package server

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// writeFrame writes one unmasked frame into bw as the websocket library
// does (header bytes, then the payload; a flush when fin).
func writeFrame(t testing.TB, bw *bufio.Writer, fin bool, payload []byte) []byte {
	var h []byte
	b0 := byte(0x2) // binary
	if fin {
		b0 |= 0x80
	}
	h = append(h, b0)
	switch n := len(payload); {
	case n > 0xffff:
		h = append(h, 127)
		h = binary.BigEndian.AppendUint64(h, uint64(n))
	case n > 125:
		h = append(h, 126)
		h = binary.BigEndian.AppendUint16(h, uint16(n))
	default:
		h = append(h, byte(n))
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(bw.WriteByte(h[0]))
	must(bw.WriteByte(h[1]))
	if len(h) > 2 {
		_, err := bw.Write(h[2:])
		must(err)
	}
	_, err := bw.Write(payload)
	must(err)
	if fin {
		must(bw.Flush())
	}
	return append(h, payload...)
}

// recordingConn records each write (a socket without writev, as TLS).
type recordingConn struct {
	net.Conn
	writes [][]byte
}

func (r *recordingConn) Write(p []byte) (int, error) {
	r.writes = append(r.writes, bytes.Clone(p))
	return len(p), nil
}

func randomPayload(r *rand.Rand) []byte {
	sizes := []int{0, 1, 5, 13, 14, 15, 20, 100, 125, 126, 200, 4000, 70000}
	n := sizes[r.IntN(len(sizes))]
	if r.IntN(4) == 0 {
		n = r.IntN(300)
	}
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// Each whole frame leaves in one write, header and payload together, as
// the bytes written.
func TestFrameWriterOneWritePerFrame(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	rc := &recordingConn{}
	fw := newFrameWriter(rc)
	if fw.vec {
		t.Fatal("a recording conn has no writev")
	}
	bw := bufio.NewWriterSize(fw, libraryWriteBuffer)
	for i := 0; i < 2000; i++ {
		frame := writeFrame(t, bw, true, randomPayload(r))
		if len(rc.writes) != 1 || !bytes.Equal(rc.writes[0], frame) {
			t.Fatalf("frame %d (%d bytes) went out in %d writes", i, len(frame), len(rc.writes))
		}
		rc.writes = nil
	}
}

// Frames of a message in pieces (fin unset, no flush between) and headers
// split across the buffer's flushes still arrive byte for byte.
func TestFrameWriterPieces(t *testing.T) {
	for _, sock := range []string{"tcp", "recording"} {
		t.Run(sock, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			var got func() []byte
			var nc net.Conn
			if sock == "tcp" {
				c, peer := tcpPair(t)
				read := make(chan []byte)
				go func() { b, _ := io.ReadAll(peer); read <- b }()
				nc = c
				got = func() []byte { c.Close(); return <-read }
			} else {
				rc := &recordingConn{}
				nc = rc
				got = func() []byte { return bytes.Join(rc.writes, nil) }
			}
			fw := newFrameWriter(nc)
			if fw.vec != (sock == "tcp") {
				t.Fatalf("writev for %s: %v", sock, fw.vec)
			}
			bw := bufio.NewWriterSize(fw, libraryWriteBuffer)
			var want []byte
			for i := 0; i < 3000; i++ {
				want = append(want, writeFrame(t, bw, r.IntN(3) == 0, randomPayload(r))...)
			}
			want = append(want, writeFrame(t, bw, true, nil)...)
			if b := got(); !bytes.Equal(b, want) {
				t.Fatalf("got %d bytes, want %d (first difference at %d)", len(b), len(want), firstDiff(b, want))
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Sending a frame through writev allocates nothing, whether the write
// may wait or not.
func TestFrameWriterAllocs(t *testing.T) {
	for _, nowait := range []bool{false, true} {
		c, peer := tcpPair(t)
		go io.Copy(io.Discard, peer)
		fw := newFrameWriter(c)
		fw.nowait.Store(nowait)
		if nowait && fw.rc == nil {
			t.Fatal("a TCP socket here has no writes that do not wait")
		}
		bw := bufio.NewWriterSize(fw, libraryWriteBuffer)
		header := []byte{0x82, 126, 0x03, 0xe8} // fin, binary, 1,000 bytes
		payload := make([]byte, 1000)
		if n := testing.AllocsPerRun(200, func() {
			bw.Write(header)
			bw.Write(payload)
			bw.Flush()
		}); n != 0 {
			t.Fatalf("nowait %v: %v allocations a frame", nowait, n)
		}
	}
}

// tcpPair is a loopback TCP connection's two ends, closed at the test's end.
func tcpPair(t *testing.T) (c, peer net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if c, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if peer, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return c, peer
}

// Writes that must not wait never wait while what the socket did not take
// fits in the tail (maxTail); one that would leave more calls onWait and
// then waits. A write that may wait sends the tail first, and the peer
// gets every frame byte for byte, in order.
func TestFrameWriterNoWait(t *testing.T) {
	c, peer := tcpPair(t)
	fw := newFrameWriter(c)
	if fw.rc == nil {
		t.Skip("no writes that do not wait on this platform")
	}
	var waits atomic.Int32
	fw.onWait = func() { waits.Add(1) }
	bw := bufio.NewWriterSize(fw, libraryWriteBuffer)
	r := rand.New(rand.NewPCG(5, 6))
	small := func() []byte { // far smaller than maxTail
		p := make([]byte, r.IntN(4000))
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		return p
	}
	var want []byte
	fw.nowait.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Until the socket's buffers are full and the tail holds half of
		// maxTail (at most 64 MiB, far more than loopback buffers hold).
		for len(want) < 64<<20 && fw.tailLen.Load() < maxTail/2 {
			want = append(want, writeFrame(t, bw, r.IntN(3) != 0, small())...)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("writes that must not wait waited on a peer that reads nothing")
	}
	if !fw.blocked() || waits.Load() != 0 {
		t.Fatalf("after %d bytes to a peer that reads nothing: tail %d bytes, %d waits", len(want), fw.tailLen.Load(), waits.Load())
	}
	// A frame larger than the tail's room waits, once onWait was called.
	big := make([]byte, maxTail)
	wrote := make(chan []byte)
	go func() { wrote <- writeFrame(t, bw, true, big) }()
	select {
	case <-wrote:
		t.Fatal("a write that would pass maxTail did not wait")
	case <-time.After(200 * time.Millisecond):
	}
	if waits.Load() != 1 {
		t.Fatalf("onWait called %d times, want once", waits.Load())
	}
	read := make(chan []byte)
	go func() { b, _ := io.ReadAll(peer); read <- b }()
	want = append(want, <-wrote...)
	fw.nowait.Store(false)
	for range 50 { // these may wait, and go out after the tail
		want = append(want, writeFrame(t, bw, true, randomPayload(r))...)
	}
	if fw.blocked() {
		t.Fatal("a write that may wait left the tail unsent")
	}
	c.Close()
	if b := <-read; !bytes.Equal(b, want) {
		t.Fatalf("got %d bytes, want %d (first difference at %d)", len(b), len(want), firstDiff(b, want))
	}
}
