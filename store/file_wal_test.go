package store

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// crashCopy copies f's files as a crash at this instant would leave them:
// the committer is held between groups (by a write it has taken and not
// applied), so neither file is being written. That write is committed
// only in f.
func crashCopy(t *testing.T, f *File) (dir string) {
	t.Helper()
	taken, release := holdCommitter(f)
	done := make(chan error, 1)
	go func() { _, err := f.Apply(bg, "held", Put("k", []byte("v"))); done <- err }()
	<-taken
	dir = t.TempDir()
	for _, suffix := range []string{"", walSuffix} {
		copyFile(t, f.cfg.Path+suffix, filepath.Join(dir, "data", "statecast.db"+suffix))
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.hookGroup.Store(nil)
	return dir
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o750); err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
}

// roomState is what a reader of room sees: its snapshot and history.
func roomState(t *testing.T, s Store, room string) (Snapshot, []Batch) {
	t.Helper()
	snap := mustSnapshot(t, s, room)
	return snap, mustHistory(t, s, room, snap.Oldest)
}

// TestFileWALRecoversAnsweredWrites: every answered write, session and
// write id is in the log before the bbolt file has it, and a crash before
// any checkpoint loses none of them.
func TestFileWALRecoversAnsweredWrites(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{Retention: RetentionPolicy{Default: Retention{MaxEvents: 20}}})
	f.every = time.Hour
	for i := range 60 {
		w := Put(fmt.Sprintf("k%d", i%7), []byte(fmt.Sprintf("v%d", i)))
		w.Wid = fmt.Sprintf("w%d", i)
		mustApply(t, f, fmt.Sprintf("r%d", i%3), w)
		if i%10 == 0 {
			mustApply(t, f, "r0", Delete(fmt.Sprintf("k%d", i%7)))
		}
	}
	if err := f.SaveSession(bg, SessionRecord{ID: "s1", Subject: "ann"}); err != nil {
		t.Fatal(err)
	}
	if n := f.checkpoints.Load(); n != 0 {
		t.Fatalf("%d checkpoints before the crash, want 0: the test needs the writes in the log only", n)
	}
	dir := crashCopy(t, f)

	g := openFile(t, dir, FileConfig{Retention: RetentionPolicy{Default: Retention{MaxEvents: 20}}})
	for _, room := range []string{"r0", "r1", "r2"} {
		wantSnap, wantHist := roomState(t, f, room)
		gotSnap, gotHist := roomState(t, g, room)
		if !reflect.DeepEqual(gotSnap, wantSnap) || !reflect.DeepEqual(gotHist, wantHist) {
			t.Errorf("room %s after recovery:\n got %+v\n%+v\nwant %+v\n%+v", room, gotSnap, gotHist, wantSnap, wantHist)
		}
	}
	w := Put("k3", []byte("v59")) // the last write: r2, k3
	w.Wid = "w59"
	if res := mustApply(t, g, "r2", w); !res.Dup {
		t.Errorf("resent write id after recovery: %+v, want a duplicate", res)
	}
	if _, ok, err := g.Session(bg, "s1"); err != nil || !ok {
		t.Errorf("session after recovery: ok %v, err %v", ok, err)
	}
	if snap := mustSnapshot(t, g, "held"); snap.Rev != 0 {
		t.Errorf("the write taken after the crash is in the copy: %+v", snap)
	}
}

// TestFileWALTornTail: a record cut short by the crash (its group was
// never answered) ends recovery; the records before it are all kept.
func TestFileWALTornTail(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	f.every = time.Hour
	var ends []int64
	for i := range 10 {
		mustApply(t, f, "r", Put(fmt.Sprintf("k%d", i), bytes.Repeat([]byte("v"), 100)))
		ends = append(ends, f.wal.off) // the committer is idle between answered writes
	}
	dir := crashCopy(t, f)
	wal := filepath.Join(dir, "data", "statecast.db"+walSuffix)
	if err := os.Truncate(wal, ends[8]+20); err != nil { // the 10th record torn
		t.Fatal(err)
	}
	g := openFile(t, dir, FileConfig{})
	if snap := mustSnapshot(t, g, "r"); snap.Rev != 9 || len(snap.Items) != 9 {
		t.Errorf("after a torn 10th record: rev %d with %d keys, want 9 and 9", snap.Rev, len(snap.Items))
	}
	if res := mustApply(t, g, "r", Put("k9", []byte("again"))); res.Rev != 10 {
		t.Errorf("next write after recovery: rev %d, want 10", res.Rev)
	}
}

// TestFileWALDeadRecordsNotReplayed: after a checkpoint the log is written
// again from its start; what remains of the older, longer records behind
// the new ones is never replayed, after a crash or a clean reopen.
func TestFileWALDeadRecordsNotReplayed(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	f.every = time.Hour
	for i := range 5 {
		mustApply(t, f, "r", Put(fmt.Sprintf("big%d", i), bytes.Repeat([]byte{byte(i)}, 20_000)))
	}
	mustSnapshot(t, f, "r") // a reader: checkpoints
	if f.checkpoints.Load() != 1 {
		t.Fatalf("%d checkpoints after a read, want 1", f.checkpoints.Load())
	}
	mustApply(t, f, "r", Put("small", []byte("s")))
	mustApply(t, f, "r", Delete("big0"))
	dir := crashCopy(t, f)
	g := openFile(t, dir, FileConfig{})
	wantSnap, wantHist := roomState(t, f, "r")
	gotSnap, gotHist := roomState(t, g, "r")
	if !reflect.DeepEqual(gotSnap, wantSnap) || !reflect.DeepEqual(gotHist, wantHist) || gotSnap.Rev != 7 {
		t.Errorf("after recovery: rev %d, %d keys; want rev %d, %d keys, equal histories", gotSnap.Rev, len(gotSnap.Items), wantSnap.Rev, len(wantSnap.Items))
	}
	// A clean close checkpoints; reopening replays nothing twice.
	path := g.cfg.Path
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	h, err := OpenFile(FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if snap := mustSnapshot(t, h, "r"); !reflect.DeepEqual(snap, wantSnap) {
		t.Errorf("after a clean reopen: %+v, want %+v", snap, wantSnap)
	}
}

// TestFileWALFailureRefusesWrites: once the log cannot be written, the
// write that hit it and every later one fail, readers still see every
// answered write, and a restart has them all.
func TestFileWALFailureRefusesWrites(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	f.every = time.Hour
	for i := range 5 {
		mustApply(t, f, "r", Put(fmt.Sprintf("k%d", i), []byte("v")))
	}
	taken, release := holdCommitter(f)
	failed := make(chan error, 1)
	go func() { _, err := f.Apply(bg, "r", Put("lost", []byte("v"))); failed <- err }()
	<-taken
	_ = f.wal.f.Close() // the disk goes away under the log
	release()
	if err := <-failed; !errors.Is(err, errWALFailed) {
		t.Fatalf("write whose log append failed: %v, want errWALFailed", err)
	}
	if _, err := f.Apply(bg, "r", Put("later", []byte("v"))); !errors.Is(err, errWALFailed) {
		t.Errorf("a later write: %v, want errWALFailed", err)
	}
	if snap := mustSnapshot(t, f, "r"); snap.Rev != 5 || len(snap.Items) != 5 {
		t.Errorf("reader after the failure: rev %d with %d keys, want the 5 answered writes", snap.Rev, len(snap.Items))
	}
	path := f.cfg.Path
	_ = f.Close()
	wantAfterRestart(t, path, 5)
}

// TestFileWALRebuildKeepsAnsweredWrites: a group that fails inside the
// transaction is taken out of it without taking the answered, not yet
// checkpointed groups before it.
func TestFileWALRebuildKeepsAnsweredWrites(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	f.every = time.Hour
	for i := range 5 {
		mustApply(t, f, "r", Put(fmt.Sprintf("k%d", i), []byte("v")))
	}
	boom := errors.New("disk on fire")
	fail := func() error { return boom }
	f.hookCommit.Store(&fail)
	if _, err := f.Apply(bg, "r", Put("failed", []byte("v"))); !errors.Is(err, boom) {
		t.Fatalf("write with a failing commit: %v, want the commit error", err)
	}
	f.hookCommit.Store(nil)
	if res := mustApply(t, f, "r", Put("k5", []byte("v"))); res.Rev != 6 {
		t.Errorf("next write: rev %d, want 6", res.Rev)
	}
	snap := mustSnapshot(t, f, "r")
	if snap.Rev != 6 || len(snap.Items) != 6 {
		t.Errorf("after the failed group: rev %d with %d keys, want 6 and 6", snap.Rev, len(snap.Items))
	}
	for _, kv := range snap.Items {
		if kv.Key == "failed" {
			t.Errorf("the failed write is visible: %+v", kv)
		}
	}
}

// TestFileWALFailedSyncKillsItsRecord: when the log's fdatasync fails the
// record may reach the disk whole all the same; the store commits the
// answered writes with the log's next generation before telling the
// writer it failed, so a restart never brings that write back. Here the
// record is left in the file, as such a disk could leave it, and the log
// had just started again (a checkpoint), so no answered write forces
// that commit.
func TestFileWALFailedSyncKillsItsRecord(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	f.every = time.Hour
	mustApply(t, f, "r", Put("answered", []byte("v")))
	mustSnapshot(t, f, "r") // a checkpoint: the log starts again, nothing pending
	taken, release := holdCommitter(f)
	failed := make(chan error, 1)
	go func() { _, err := f.Apply(bg, "r", Put("failed", []byte("v"))); failed <- err }()
	<-taken
	f.wal.sync = func(*os.File) error { return errors.New("EIO") }
	release()
	if err := <-failed; !errors.Is(err, errWALFailed) || strings.Contains(err.Error(), "unknown") {
		t.Fatalf("write whose fdatasync failed: %v, want errWALFailed with a known outcome", err)
	}
	if f.wal.gen == 1 || f.checkpoints.Load() != 2 {
		t.Errorf("log generation %d after %d checkpoints: the failed record was not made dead", f.wal.gen, f.checkpoints.Load())
	}
	path := f.cfg.Path
	if err := f.Close(); !errors.Is(err, errWALFailed) {
		t.Errorf("Close of a store whose log failed: %v, want errWALFailed", err)
	}
	g, err := OpenFile(FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	snap := mustSnapshot(t, g, "r")
	if snap.Rev != 1 || len(snap.Items) != 1 || snap.Items[0].Key != "answered" {
		t.Errorf("after a restart: %+v, want only the answered write at rev 1", snap)
	}
}

// TestFileWALFailedCheckpointStops: a checkpoint whose commit fails breaks
// the store (fail-stop): later writes and reads fail, Close returns at
// once with the error, and a restart replays every answered write from
// the log.
func TestFileWALFailedCheckpointStops(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{})
	f.every = time.Hour
	for i := range 5 {
		mustApply(t, f, "r", Put(fmt.Sprintf("k%d", i), []byte("v")))
	}
	boom := errors.New("EIO")
	fail := func() error { return boom }
	f.hookCheckpoint.Store(&fail)
	if _, err := f.Snapshot(bg, "r", ""); !errors.Is(err, boom) {
		t.Errorf("read needing the failed checkpoint: %v, want its error", err)
	}
	if _, err := f.Apply(bg, "r", Put("later", []byte("v"))); !errors.Is(err, boom) {
		t.Errorf("write after a failed checkpoint: %v, want its error", err)
	}
	path := f.cfg.Path
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	select {
	case err := <-closed:
		if !errors.Is(err, boom) {
			t.Errorf("Close: %v, want the checkpoint's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs after a failed checkpoint")
	}
	wantAfterRestart(t, path, 5)
}

// wantAfterRestart opens the store at path again and checks that room r
// holds the n writes k0…k(n-1) answered before, at revision n.
func wantAfterRestart(t *testing.T, path string, n int) {
	t.Helper()
	g, err := OpenFile(FileConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if snap := mustSnapshot(t, g, "r"); snap.Rev != uint64(n) || len(snap.Items) != n {
		t.Errorf("after a restart: rev %d with %d keys, want the %d answered writes", snap.Rev, len(snap.Items), n)
	}
}
