package server

import (
	"testing"

	"github.com/statecast/statecast/rooms"
)

// TestIdleConnectionDropsGrownDrainBuffers: an idle connection gives back
// the drain buffers a burst grew (a resume's replay of 1,000 revisions
// grew them to 80 KiB), and keeps the small ones a trickle reuses.
func TestIdleConnectionDropsGrownDrainBuffers(t *testing.T) {
	c := &conn{msgs: make([]rooms.Message, 0, 1024), spare: make([]*sub, 0, 1024)}
	c.dropSendState()
	if c.msgs != nil || c.spare != nil {
		t.Errorf("after a burst: drain buffers of %d and %d entries kept", cap(c.msgs), cap(c.spare))
	}
	c = &conn{msgs: make([]rooms.Message, 0, keptDrain), spare: make([]*sub, 0, 4)}
	c.dropSendState()
	if cap(c.msgs) != keptDrain || cap(c.spare) != 4 {
		t.Errorf("small drain buffers dropped: %d and %d entries kept", cap(c.msgs), cap(c.spare))
	}
}
