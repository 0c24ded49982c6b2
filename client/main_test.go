package client_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/servertest"
)

// The client's reader and keepalive goroutines end with their connection,
// and Watch's request with its context: nothing may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dial connects to node n with codec and closes the connection when the
// test ends.
func dial(t *testing.T, n *servertest.Node, codec string) *client.Conn {
	t.Helper()
	c, err := client.Dial(servertest.Context(t), n.WS, &client.Options{Codec: codec})
	if err != nil {
		t.Fatalf("Dial(%s): %v", codec, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var codecs = []string{"json", "msgpack", "json2"}
