package storetest

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/statecast/statecast/store"
)

// testBackup: a store that implements store.Exporter and store.Importer
// writes every room into a backup, and a fresh store of its kind restored
// from it holds each room's keys, revisions, history and write ids as they
// were; writes there continue from the head.
func testBackup(t *testing.T, s *suite) {
	if _, ok := s.open(t, Config{}).(store.Importer); !ok {
		t.Skip("the store does not implement store.Importer")
	}
	ret := store.RetentionPolicy{Default: store.Retention{MaxEvents: 4}}
	fill := func(t *testing.T) store.Store {
		src := s.open(t, Config{Retention: ret})
		put(t, src, "a", "x", "1")
		apply(t, src, "a", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "l", Value: []byte("v"), Lease: "L1"}}})
		apply(t, src, "a", txn(opPut("y", "2"), opPut("z", "3")))
		del(t, src, "a", "x")
		apply(t, src, "a", store.Write{Ops: []store.Op{opPut("y", "4")}, Wid: "w1"})
		for range 10 { // more than retained: the oldest revisions go
			put(t, src, "b", "k", "v")
		}
		put(t, src, "c", "only", "")
		snapshot(t, src, "never-written", "") // a room only read is not backed up
		return src
	}
	// roundTrip writes src's backup and reads it back into a fresh store.
	roundTrip := func(t *testing.T, src store.Store) (store.Store, store.BackupHeader) {
		var buf bytes.Buffer
		bw, err := store.NewBackupWriter(&buf, src.(store.Exporter).BackupHeader())
		if err != nil {
			t.Fatal(err)
		}
		if err := src.(store.Exporter).Export(bg, bw.Room); err != nil {
			t.Fatalf("Export: %v", err)
		}
		if err := bw.Close(); err != nil {
			t.Fatal(err)
		}
		if br, err := store.VerifyBackup(bytes.NewReader(buf.Bytes())); err != nil || br.Rooms() != 3 {
			t.Fatalf("VerifyBackup: %v (want 3 rooms)", err)
		}
		br, err := store.NewBackupReader(&buf)
		if err != nil {
			t.Fatal(err)
		}
		dst := s.open(t, Config{Retention: ret})
		for {
			img, err := br.Next()
			if err == io.EOF {
				return dst, br.Header
			}
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if err := dst.(store.Importer).Import(bg, img); err != nil {
				t.Fatalf("Import(%q): %v", img.Room, err)
			}
		}
	}
	parallel(t,
		namedTest{"RestoredRoomsEqual", func(t *testing.T) {
			src := fill(t)
			dst, _ := roundTrip(t, src)
			for _, room := range []string{"a", "b", "c"} {
				want, got := snapshot(t, src, room, ""), snapshot(t, dst, room, "")
				diff(t, room+" items", want.Items, got.Items)
				if got.Rev != want.Rev || got.Oldest != want.Oldest {
					t.Errorf("room %s: rev %d oldest %d, want %d %d", room, got.Rev, got.Oldest, want.Rev, want.Oldest)
				}
				wh, gh := history(t, src, room, want.Oldest, 0), history(t, dst, room, got.Oldest, 0)
				for i := range gh {
					if gh[i].Epoch != got.Epoch {
						t.Errorf("room %s revision %d: epoch %q, the snapshot's is %q", room, gh[i].Rev, gh[i].Epoch, got.Epoch)
					}
					gh[i].Epoch = wh[i].Epoch
				}
				diff(t, room+" history", wh, gh)
			}
			if snap := snapshot(t, dst, "never-written", ""); snap.Rev != 0 {
				t.Errorf("a room only read was restored at revision %d", snap.Rev)
			}
		}},
		namedTest{"WritesContinueFromTheHead", func(t *testing.T) {
			dst, _ := roundTrip(t, fill(t))
			if res := put(t, dst, "b", "k", "w"); res.Rev != 11 {
				t.Errorf("a write after the restore committed at %d, want 11", res.Rev)
			}
			if got := snapshot(t, dst, "b", "").Items; len(got) != 1 || got[0].Version != 11 || got[0].CreateRev != 1 {
				t.Errorf("key after the restore and a write: %+v, want version 11 created at 1", got)
			}
			res := apply(t, dst, "a", store.Write{Ops: []store.Op{opPut("y", "4")}, Wid: "w1"})
			if !res.Dup || res.Rev != 5 {
				t.Errorf("a write id of the restored history: %+v, want a duplicate of revision 5", res)
			}
			_, err := dst.Apply(bg, "a", store.Write{Ops: []store.Op{opPut("y", "other")}, Wid: "w1"})
			var reused *store.WidReusedError
			if !errors.As(err, &reused) {
				t.Errorf("another write under a restored write id: %v, want a WidReusedError", err)
			}
			var leased []string
			if err := dst.Leased(bg, func(room string, kv store.KV) error {
				leased = append(leased, room+"/"+kv.Key+"@"+kv.Lease)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			diff(t, "leased keys", []string{"a/l@L1"}, leased)
		}},
		namedTest{"RoomsListsHeads", func(t *testing.T) {
			dst, _ := roundTrip(t, fill(t))
			heads := map[string]uint64{}
			if err := dst.(store.Importer).Rooms(bg, func(room, epoch string, head uint64) error {
				if epoch == "" {
					t.Errorf("room %s listed without an epoch", room)
				}
				heads[room] = head
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			diff(t, "rooms", map[string]uint64{"a": 5, "b": 10, "c": 1}, heads)
		}},
		namedTest{"ImportReplaces", func(t *testing.T) {
			dst := s.open(t, Config{})
			put(t, dst, "r", "old", "1")
			put(t, dst, "r", "old", "2")
			img := &store.RoomImage{Room: "r", Epoch: store.NewEpoch(), Head: 7, Oldest: 8, Items: []store.KV{kv("new", "v", 3, 7, 2)}}
			if err := dst.(store.Importer).Import(bg, img); err != nil {
				t.Fatal(err)
			}
			snap := snapshot(t, dst, "r", "")
			diff(t, "items", img.Items, snap.Items)
			if snap.Rev != 7 || snap.Oldest != 8 {
				t.Errorf("rev %d oldest %d, want 7 8", snap.Rev, snap.Oldest)
			}
			wantCompacted(t, historyErr(dst, "r", 7), 8)
		}},
		namedTest{"CorruptBackupRefused", func(t *testing.T) {
			src := fill(t)
			var buf bytes.Buffer
			bw, _ := store.NewBackupWriter(&buf, src.(store.Exporter).BackupHeader())
			if err := src.(store.Exporter).Export(bg, bw.Room); err != nil {
				t.Fatal(err)
			}
			if err := bw.Close(); err != nil {
				t.Fatal(err)
			}
			b := buf.Bytes()
			flipped := bytes.Replace(b, []byte(`"k":"y"`), []byte(`"k":"Y"`), 1)
			if _, err := store.VerifyBackup(bytes.NewReader(flipped)); !errors.Is(err, store.ErrBackupChecksum) {
				t.Errorf("a changed key: %v, want ErrBackupChecksum", err)
			}
			if _, err := store.VerifyBackup(bytes.NewReader(b[:len(b)-20])); err == nil {
				t.Error("a truncated backup verified")
			}
		}},
	)
}

func historyErr(st store.Store, room string, from uint64) error {
	_, err := st.History(bg, room, from, 0)
	return err
}
