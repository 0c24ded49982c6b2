package groupcommit

import "testing"

func TestHandover(t *testing.T) {
	var a, b Handover
	if !a.Take() || a.Abandon() || a.Take() {
		t.Error("taken: neither abandoned nor taken again")
	}
	if !b.Abandon() || b.Take() {
		t.Error("abandoned: never taken")
	}
}
