package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
)

// TestSnapshotPartsMatchAppend: a snapshot written in parts (head, the
// items in two runs, tail) is byte for byte the message Append writes,
// in every codec, around the sizes where msgpack's array header grows.
func TestSnapshotPartsMatchAppend(t *testing.T) {
	values := []string{`1`, `"a<b>&c\u2028"`, `{"x":[1,2.5,null],"y":true}`, `-3`}
	for _, c := range []Codec{JSON, JSON2, Msgpack} {
		for _, n := range []int{0, 1, 15, 16, 300, 70000} {
			items := make([]Item, n)
			for i := range items {
				it := &items[i]
				it.Key = fmt.Sprintf("/k/\"%d\"é<", i)
				if i%5 != 4 {
					if err := json.Unmarshal([]byte(values[i%len(values)]), &it.Value); err != nil {
						t.Fatal(err)
					}
				}
				it.CreateRev, it.ModRev, it.Version, it.Lease = uint64(i), uint64(i+7), uint64(i%3+1), i%7 == 0
			}
			snap := &Snapshot{T: TSnapshot, S: 300, Epoch: "e\"1", Rev: 1 << 20, Reason: "initial", Items: items}
			prefix := []byte("x") // a message before it in the frame
			if c == Msgpack {
				prefix = nil
			}
			want, err := c.Append(bytes.Clone(prefix), snap)
			if err != nil {
				t.Fatal(err)
			}
			got := AppendSnapshotHead(c, bytes.Clone(prefix), snap.S, snap.Epoch, snap.Rev, snap.Reason, n)
			half := n / 2
			if got, err = AppendSnapshotItems(c, got, items[:half], true); err != nil {
				t.Fatal(err)
			}
			if got, err = AppendSnapshotItems(c, got, items[half:], half == 0); err != nil {
				t.Fatal(err)
			}
			got = AppendSnapshotTail(c, got)
			if !bytes.Equal(got, want) {
				i := 0
				for i < min(len(got), len(want)) && got[i] == want[i] {
					i++
				}
				t.Fatalf("%s, %d items: parts differ from Append at byte %d: %q vs %q", c.Subprotocol(), n, i, got[i:min(i+40, len(got))], want[i:min(i+40, len(want))])
			}
		}
	}
}
