package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// backupWith writes a backup of one room and the records.
func backupWith(t *testing.T, sessions []SessionRecord, leases []LeaseRecord) []byte {
	t.Helper()
	var buf bytes.Buffer
	bw, err := NewBackupWriter(&buf, BackupHeader{Store: "file", Epoch: "e1", Time: time.Unix(1, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	img := &RoomImage{Room: "r", Epoch: "e1", Head: 1, Oldest: 2, Items: []KV{{Key: "k", Value: []byte("1"), CreateRev: 1, ModRev: 1, Version: 1, Lease: "n1.a/session:s_1"}}}
	if err := bw.Room(img); err != nil {
		t.Fatal(err)
	}
	if err := bw.Records(sessions, leases); err != nil {
		t.Fatal(err)
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBackupRecords: the session and TTL lease records a backup holds
// read back as written, without the source's owner, generation and
// listing; the checksum covers them.
func TestBackupRecords(t *testing.T) {
	sess := SessionRecord{ID: "s_1", Subject: "ann", ResumeHash: bytes.Repeat([]byte{1}, 32), PrevHash: bytes.Repeat([]byte{2}, 32),
		Lease: "session:s_1", Owner: "n1.a", Gen: 3, Deadline: 1700000000000, Listed: true}
	lease := LeaseRecord{ID: "ttl_1", Holder: "bob", TTLms: 10000, Deadline: 1700000005000}
	b := backupWith(t, []SessionRecord{sess}, []LeaseRecord{lease})
	br, err := VerifyBackup(bytes.NewReader(b))
	if err != nil || br.Rooms() != 1 || br.Header.Version != 2 {
		t.Fatalf("VerifyBackup: %v, %d rooms, version %d", err, br.Rooms(), br.Header.Version)
	}
	want := sess
	want.Owner, want.Gen, want.Listed = "", 0, false
	if len(br.Sessions) != 1 || !reflect.DeepEqual(br.Sessions[0], want) {
		t.Errorf("sessions read: %+v, want %+v", br.Sessions, want)
	}
	if len(br.Leases) != 1 || br.Leases[0] != lease {
		t.Errorf("leases read: %+v, want %+v", br.Leases, lease)
	}
	changed := bytes.Replace(b, []byte(`"holder":"bob"`), []byte(`"holder":"eve"`), 1)
	if _, err := VerifyBackup(bytes.NewReader(changed)); !errors.Is(err, ErrBackupChecksum) {
		t.Errorf("a backup whose lease record changed: %v, want the checksum error", err)
	}
	bad := backupWith(t, []SessionRecord{{ID: "s_2"}}, nil) // no lease name
	if _, err := VerifyBackup(bytes.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "bad session or lease record") {
		t.Errorf("a session record without its lease: %v", err)
	}
}

// TestBackupVersion1: a backup of the first format version, which has no
// records, still reads; a record line in one is refused.
func TestBackupVersion1(t *testing.T) {
	v1 := func(lines ...string) []byte {
		body := strings.Join(lines, "\n") + "\n"
		sum := sha256.Sum256([]byte(body))
		return []byte(body + `{"end":true,"rooms":1,"sha256":"` + hex.EncodeToString(sum[:]) + "\"}\n")
	}
	header := `{"format":"statecast-backup","version":1,"store":"file","epoch":"e1","time":"2026-01-01T00:00:00Z"}`
	room := `{"room":"r","epoch":"e1","head":1,"oldest":2,"keys":1,"batches":0}`
	key := `{"k":"k","v":"MQ==","c":1,"m":1,"n":1}`
	br, err := NewBackupReader(bytes.NewReader(v1(header, room, key)))
	if err != nil {
		t.Fatal(err)
	}
	img, err := br.Next()
	if err != nil || img.Room != "r" || len(img.Items) != 1 || string(img.Items[0].Value) != "1" {
		t.Fatalf("a version 1 room: %+v, %v", img, err)
	}
	if _, err := br.Next(); err != io.EOF || len(br.Sessions)+len(br.Leases) != 0 {
		t.Errorf("end of a version 1 backup: %v, %d records", err, len(br.Sessions)+len(br.Leases))
	}
	rec := `{"lease":{"id":"ttl_1","holder":"","ttl_ms":1000,"deadline":1}}`
	if _, err := VerifyBackup(bytes.NewReader(v1(header, room, key, rec))); err == nil {
		t.Error("a record line in a version 1 backup was read")
	}
}

// TestCarryLeases: keys of a carried session or lease lose the node their
// source stored them under, in the state and the history, and are listed
// by lease; keys of leases not carried keep their name.
func TestCarryLeases(t *testing.T) {
	img := &RoomImage{Room: "r", Items: []KV{
		{Key: "a", ModRev: 3, Lease: "n1.x/session:s_1"},
		{Key: "b", ModRev: 4, Lease: "n1.x/ttl_1"},
		{Key: "c", ModRev: 5, Lease: "n1.x/ttl_gone"},
		{Key: "d", ModRev: 6, Lease: "ttl_1"},
		{Key: "e", ModRev: 7},
	}, History: []Batch{{Rev: 4, Events: []Event{{Type: OpPut, KV: KV{Key: "b", Lease: "n1.x/ttl_1"}, Prev: &KV{Key: "b", Lease: "n1.x/session:s_1"}}}}}}
	keys := map[string][]LeaseKey{}
	CarryLeases(img, map[string]bool{"session:s_1": true, "ttl_1": true}, keys)
	var got []string
	for _, kv := range img.Items {
		got = append(got, kv.Lease)
	}
	if want := []string{"session:s_1", "ttl_1", "n1.x/ttl_gone", "ttl_1", ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("leases after carrying: %q, want %q", got, want)
	}
	if ev := img.History[0].Events[0]; ev.KV.Lease != "ttl_1" || ev.Prev.Lease != "session:s_1" {
		t.Errorf("history's leases after carrying: %q, %q", ev.KV.Lease, ev.Prev.Lease)
	}
	want := map[string][]LeaseKey{"session:s_1": {{"r", "a", 3}}, "ttl_1": {{"r", "b", 4}, {"r", "d", 6}}}
	if !reflect.DeepEqual(keys, want) {
		t.Errorf("keys listed: %+v, want %+v", keys, want)
	}
}

// TestFileImportRecords: the records a restore or a migration writes into
// a file store are there for the next server start, after a reopen.
func TestFileImportRecords(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "statecast.db")
	f, err := OpenFile(FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	sess := SessionRecord{ID: "s_1", Subject: "ann", ResumeHash: bytes.Repeat([]byte{1}, 32), Lease: "session:s_1", Deadline: 42}
	lease := LeaseRecord{ID: "ttl_1", Holder: "bob", TTLms: 1000, Deadline: 43}
	if err := f.ImportRecords(ctx, []SessionRecord{sess}, []LeaseRecord{lease}, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f, err = OpenFile(FileConfig{Path: path}); err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ss, err := f.ListSessions(ctx)
	if err != nil || len(ss) != 1 || !reflect.DeepEqual(ss[0], sess) {
		t.Errorf("sessions after the import: %+v, %v", ss, err)
	}
	ls, err := f.LeaseRecords(ctx)
	if err != nil || len(ls) != 1 || ls[0] != lease {
		t.Errorf("leases after the import: %+v, %v", ls, err)
	}
	if err := f.DeleteLeaseRecord(ctx, "ttl_1"); err != nil {
		t.Fatal(err)
	}
	if ls, err := f.LeaseRecords(ctx); err != nil || len(ls) != 0 {
		t.Errorf("leases after the delete: %+v, %v", ls, err)
	}
}
