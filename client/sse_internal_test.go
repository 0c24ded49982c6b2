package client

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func TestReadSSE(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // longer than the reader's buffer
	stream := ": comment\r\n" +
		"retry: 250\n" +
		"id: 7\nevent: put\ndata: {\"a\":\ndata:1}\n\n" + // multi-line data, joined by \n
		"id: 8\r\nevent: progress\r\ndata:{\"rev\":8}\r\n\r\n" + // CRLF, no space after ':'
		"event: nodata\n\n" + // no data: not dispatched
		"data: plain\n\n" + // no event name: "message"
		"id: 9\nevent: reset\ndata: " + long + "\n\n" +
		"id: 10\nevent: put\ndata: cut off"
	var got []string
	var retries []time.Duration
	err := readSSE(strings.NewReader(stream), func(ev SSEEvent, retry time.Duration) error {
		data := string(ev.Data)
		if len(data) > 20 {
			data = fmt.Sprintf("<%d bytes>", len(data))
		}
		got = append(got, fmt.Sprintf("%s|%s|%s", ev.ID, ev.Event, data))
		retries = append(retries, retry)
		return nil
	})
	if err != io.EOF {
		t.Fatalf("readSSE = %v, want io.EOF", err)
	}
	want := fmt.Sprint([]string{"7|put|{\"a\":\n1}", "8|progress|{\"rev\":8}", "|message|plain", fmt.Sprintf("9|reset|<%d bytes>", len(long))})
	if fmt.Sprint(got) != want {
		t.Fatalf("events\n%q\nwant\n%q", got, want)
	}
	if retries[0] != 250*time.Millisecond {
		t.Fatalf("retry = %v", retries[0])
	}

	stop := errors.New("stop")
	if err := readSSE(strings.NewReader("data: 1\n\ndata: 2\n\n"), func(SSEEvent, time.Duration) error { return stop }); err != stop {
		t.Fatalf("readSSE with a failing fn = %v", err)
	}
}
