package store

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// widBatch is a put (with its previous value) and a delete at revision 7.
func widBatch(wid string) Batch {
	return Batch{Time: time.Unix(1700000000, 5), Events: []Event{
		{Type: OpPut, KV: KV{Key: "k", Value: []byte("v2"), CreateRev: 3, ModRev: 7, Version: 2, Lease: "l"},
			Prev: &KV{Key: "k", Value: []byte("v1"), CreateRev: 3, ModRev: 3, Version: 1}, Wid: wid},
		{Type: OpDelete, KV: KV{Key: "gone", ModRev: 7},
			Prev: &KV{Key: "gone", Value: []byte("x"), CreateRev: 1, ModRev: 1, Version: 1}, Wid: wid},
	}}
}

// TestFileBatchRecordWithoutWidUnchanged: a log record written before
// write ids existed decodes as a batch without one, and a batch without
// one is still written byte for byte as then (older binaries read it); a
// batch with one round-trips it on every event.
func TestFileBatchRecordWithoutWidUnchanged(t *testing.T) {
	// widBatch("") as the file store encoded it before write ids.
	old, _ := hex.DecodeString("b180c49fd50c050201016b030702037632026c01030301037631000204676f6e65000700000001010101027800")
	want := widBatch("")
	want.Epoch, want.Rev = "e", 7
	got, err := decodeBatch("e", 7, old)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("record from before write ids: %v\n got %+v\nwant %+v", err, got, want)
	}
	if enc := encodeBatch(&want); !reflect.DeepEqual(enc, old) {
		t.Errorf("a batch without a wid encodes as %x, want the old record %x", enc, old)
	}

	with := widBatch("client-1.42")
	with.Epoch, with.Rev = "e", 7
	rec := encodeBatch(&with)
	if rec[0] != tagBatchWid {
		t.Errorf("record of a batch with a wid starts with %#x, want %#x", rec[0], tagBatchWid)
	}
	got, err = decodeBatch("e", 7, rec)
	if err != nil || !reflect.DeepEqual(got, with) {
		t.Fatalf("record with a wid: %v\n got %+v\nwant %+v", err, got, with)
	}
	if wid, err := decodeBatchWid(rec); err != nil || wid != "client-1.42" {
		t.Errorf("decodeBatchWid = %q, %v", wid, err)
	}
	if at, n, err := decodeBatchHeader(rec); err != nil || n != 2 || !at.Equal(with.Time) {
		t.Errorf("decodeBatchHeader = %v, %d, %v; want %v, 2", at, n, err, with.Time)
	}
}

// TestFileWidsGoWithTheLog: the file store remembers the write ids of the
// revisions its log retains, and forgets each with its revision; a room
// whose writes never had one has no wids bucket.
func TestFileWidsGoWithTheLog(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{Retention: RetentionPolicy{Default: Retention{MaxEvents: 3}}})
	for i := range 10 {
		w := Put("k", []byte("v"))
		if i%2 == 0 {
			w.Wid = fmt.Sprint("w", i)
		}
		mustApply(t, f, "ids", w)
		mustApply(t, f, "plain", Put("k", []byte("v")))
	}
	// Revision i+1 had id wi for even i; 9..11 are retained after this.
	mustApply(t, f, "ids", Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("v")}}, Wid: "w10"})
	var got, fps []string
	err := f.view(func(tx *bolt.Tx) error {
		if roomBucket(tx, "plain").Bucket(bucketWids) != nil || roomBucket(tx, "plain").Bucket(bucketFps) != nil {
			t.Error("a room never written with a wid has a wids or fingerprints bucket")
		}
		if err := roomBucket(tx, "ids").Bucket(bucketFps).ForEach(func(k, v []byte) error {
			fps = append(fps, string(k))
			return nil
		}); err != nil {
			return err
		}
		return roomBucket(tx, "ids").Bucket(bucketWids).ForEach(func(k, v []byte) error {
			got = append(got, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"w10", "w8"}; !reflect.DeepEqual(got, want) || !reflect.DeepEqual(fps, want) {
		t.Errorf("wids remembered %v, fingerprints %v, want those of the retained revisions %v", got, fps, want)
	}
}

// TestFileWidOfAnOlderBinary: an id an older binary remembered has no
// fingerprint; a repeat of it is its commit whatever it carries, and the
// file stays readable by that binary (the wids values keep their form).
func TestFileWidOfAnOlderBinary(t *testing.T) {
	dir := t.TempDir()
	f := openFile(t, dir, FileConfig{})
	first := mustApply(t, f, "r", Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("v")}}, Wid: "old"})
	err := updateDB(f, func(tx *bolt.Tx) error { // as the older binary left it
		return roomBucket(tx, "r").DeleteBucket(bucketFps)
	})
	if err != nil {
		t.Fatal(err)
	}
	res := mustApply(t, f, "r", Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("other")}}, Wid: "old"})
	if !res.Dup || res.Rev != first.Rev {
		t.Errorf("repeat of an older binary's id: %+v, want dup at %d", res, first.Rev)
	}
	res = mustApply(t, f, "r", Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("v")}}, Wid: "~scope~old", LegacyWid: "old"})
	if !res.Dup || res.Rev != first.Rev {
		t.Errorf("a retry naming an older binary's id as its legacy id: %+v, want dup at %d", res, first.Rev)
	}
	err = f.view(func(tx *bolt.Tx) error {
		v := roomBucket(tx, "r").Bucket(bucketWids).Get([]byte("old"))
		if rev, n := binary.Uvarint(v); n != len(v) || rev != first.Rev {
			t.Errorf("wids value %x, want uvarint(%d) alone, as an older binary reads it", v, first.Rev)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
