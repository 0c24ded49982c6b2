package hookstest

import (
	"strings"
	"testing"

	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/wire"
)

// rec is a delivery of revisions from..to of room in epoch, answered status;
// each revision's one event carries value.
func rec(room, epoch string, from, to uint64, status int, value string) Record {
	d := hooks.Delivery{Type: hooks.TypeRevisions, Room: room, Epoch: epoch, FromRev: from, ToRev: to}
	for r := from; r <= to; r++ {
		d.Revisions = append(d.Revisions, hooks.Revision{Rev: r, Events: []wire.Event{{Type: "put", Key: "k", Value: wire.Value(value), ModRev: r}}})
	}
	return Record{Status: status, Key: d.Key(), Delivery: d}
}

func TestCheckFindsEveryBrokenGuarantee(t *testing.T) {
	want := map[string]Want{"r": {Rev: 4}}
	good := []Record{rec("r", "e", 1, 2, 200, "1"), rec("r", "e", 3, 4, 500, "1"), rec("r", "e", 3, 4, 200, "1")}
	if err := Check(good, want); err != nil {
		t.Fatalf("a retried delivery: %v", err)
	}
	snap := Record{Status: 200, Delivery: hooks.Delivery{Type: hooks.TypeSnapshot, Room: "r", Epoch: "f", FromRev: 9, ToRev: 9, Reason: hooks.ReasonEpoch}}
	snap.Key = snap.Delivery.Key()
	cases := []struct {
		name    string
		records []Record
		want    string
	}{
		{"a gap", []Record{rec("r", "e", 1, 2, 200, "1"), rec("r", "e", 4, 4, 200, "1")}, "a gap"},
		{"not all", []Record{rec("r", "e", 1, 3, 200, "1")}, "acknowledged up to 3, want 4"},
		{"never acknowledged", []Record{rec("r", "e", 1, 4, 500, "1")}, "acknowledged up to 0"},
		{"a duplicate that differs", []Record{rec("r", "e", 1, 2, 500, "1"), rec("r", "e", 1, 4, 200, "2")}, "twice with other events"},
		{"another epoch mid-way", []Record{rec("r", "e", 1, 2, 200, "1"), rec("r", "f", 3, 4, 200, "1")}, "without a snapshot"},
		{"an unexpected snapshot", []Record{rec("r", "e", 1, 2, 200, "1"), snap}, "unexpected snapshot"},
		{"a header naming another delivery", []Record{{Status: 200, Key: "x", Delivery: rec("r", "e", 1, 4, 200, "1").Delivery}}, "names"},
	}
	for _, c := range cases {
		if err := Check(c.records, want); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
