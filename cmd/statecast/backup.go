package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
)

// backup, restore and migrate (docs/BACKUP.md): a backup is taken through
// a running server; restore and migrate open the stores themselves, with
// no server using them.

var backupUsage = map[string]string{
	"backup":  "statecast backup [--url URL] [--admin-token-file F] FILE",
	"restore": "statecast restore --store STORE [--redis-cluster] [--redis-prefix P] FILE",
	"migrate": "statecast migrate --from STORE --to STORE [--force] [--from-redis-cluster] [--to-redis-cluster] [--redis-prefix P]",
}

// keepAll is the retention the commands open stores with: a room's whole
// retained history is read and carried, whatever the server keeps.
var keepAll = store.RetentionPolicy{Default: store.Retention{MaxEvents: math.MaxInt32, MaxBytes: math.MaxInt64}}

func runBackupCmd(cmd string, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return backupCmd(ctx, cmd, args, os.Stderr)
}

func backupCmd(ctx context.Context, cmd string, args []string, errOut io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprintf(errOut, "usage: %s\n", backupUsage[cmd])
		fs.PrintDefaults()
	}
	var (
		url, token, tokenFile, storeArg, from, to, prefix string
		cluster, fromCluster, toCluster, force            bool
	)
	switch cmd {
	case "backup":
		fs.StringVar(&url, "url", "http://127.0.0.1:8080", "server URL")
		fs.StringVar(&token, "admin-token", "", "the server's admin token (prefer --admin-token-file); loopback needs none")
		fs.StringVar(&tokenFile, "admin-token-file", "", "file holding the server's admin token")
	case "restore":
		fs.StringVar(&storeArg, "store", "", "store to restore into: file (./data), file:DIR, or a redis:// URL")
		fs.BoolVar(&cluster, "redis-cluster", false, "the --store URL lists Redis Cluster seed nodes, comma-separated")
	case "migrate":
		fs.StringVar(&from, "from", "", "store to read: file (./data), file:DIR, or a redis:// URL")
		fs.StringVar(&to, "to", "", "store to write: file (./data), file:DIR, or a redis:// URL")
		fs.BoolVar(&force, "force", false, "write into a destination that holds rooms of another store")
		fs.BoolVar(&fromCluster, "from-redis-cluster", false, "the --from URL lists Redis Cluster seed nodes")
		fs.BoolVar(&toCluster, "to-redis-cluster", false, "the --to URL lists Redis Cluster seed nodes")
	}
	if cmd != "backup" {
		fs.StringVar(&prefix, "redis-prefix", "sc", "prefix of the Redis keys (as serve --redis-prefix)")
	}
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	switch cmd {
	case "backup":
		if fs.NArg() != 1 {
			fs.Usage()
			return errors.New("backup takes one FILE")
		}
		tok, err := secret(token, tokenFile)
		if err != nil {
			return err
		}
		return backup(ctx, url, tok, fs.Arg(0), errOut)
	case "restore":
		if fs.NArg() != 1 || storeArg == "" {
			fs.Usage()
			return errors.New("restore takes --store and one FILE")
		}
		return restore(ctx, storeSpec{arg: storeArg, cluster: cluster, prefix: prefix}, fs.Arg(0), errOut)
	default:
		if fs.NArg() != 0 || from == "" || to == "" {
			fs.Usage()
			return errors.New("migrate takes --from and --to")
		}
		return migrate(ctx, storeSpec{arg: from, cluster: fromCluster, prefix: prefix},
			storeSpec{arg: to, cluster: toCluster, prefix: prefix}, force, errOut)
	}
}

// backup saves the server's backup to file: written beside it, checked,
// synced, then renamed, so file is never a partial backup.
func backup(ctx context.Context, url, token, file string, errOut io.Writer) error {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/v1/admin/backup", nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("backup: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	tmp := file + ".partial"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // gone after the rename
	// It holds sessions' resume hashes: owner only, even when a partial
	// one of another mode was left behind.
	if err := out.Chmod(0o600); err != nil {
		out.Close()
		return err
	}
	n, err := io.Copy(out, resp.Body)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	br, err := verifyFile(tmp)
	if err != nil {
		return fmt.Errorf("backup: the server's backup is incomplete (see its log): %w", err)
	}
	h, rooms := br.Header, br.Rooms()
	if err := os.Rename(tmp, file); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(file)); err != nil {
		return err
	}
	fmt.Fprintf(errOut, "backup: %s store, %d rooms, %d sessions, %d TTL leases, %s %s\n", h.Store, rooms, len(br.Sessions), len(br.Leases), sizeRate(n, time.Since(start)), roomRate(rooms, time.Since(start)))
	return nil
}

func verifyFile(path string) (*store.BackupReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return store.VerifyBackup(f)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func sizeRate(n int64, d time.Duration) string {
	return fmt.Sprintf("%.1f MB in %.2fs (%.1f MB/s)", float64(n)/1e6, d.Seconds(), float64(n)/1e6/max(d.Seconds(), 1e-9))
}

func roomRate(rooms int, d time.Duration) string {
	return fmt.Sprintf("%.0f rooms/s", float64(rooms)/max(d.Seconds(), 1e-9))
}

// storeSpec is a STORE argument: what serve --store takes, or file:DIR.
type storeSpec struct {
	arg     string
	cluster bool
	prefix  string
}

// filePath returns the database path of a file store spec, "" for others.
func (s storeSpec) filePath() string {
	switch {
	case s.arg == "file":
		return filepath.Join("data", "statecast.db")
	case strings.HasPrefix(s.arg, "file:"):
		return filepath.Join(strings.TrimPrefix(s.arg, "file:"), "statecast.db")
	}
	return ""
}

// backupStore is what restore and migrate need of a store.
type backupStore interface {
	store.Store
	store.Exporter
	store.Importer
}

func (s storeSpec) open(ctx context.Context) (backupStore, error) {
	if path := s.filePath(); path != "" {
		return store.OpenFile(store.FileConfig{Path: path, Retention: keepAll})
	}
	if strings.HasPrefix(s.arg, "redis://") || strings.HasPrefix(s.arg, "rediss://") {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return redisstore.New(ctx, redisstore.Config{URL: s.arg, Cluster: s.cluster, Prefix: s.prefix, Retention: keepAll})
	}
	return nil, fmt.Errorf("unknown store %q: want file, file:DIR or a redis:// URL", s.arg)
}

// openWithEpoch opens a file store with epoch (when it holds no room yet),
// any other store as it is.
func (s storeSpec) openWithEpoch(ctx context.Context, epoch string) (backupStore, error) {
	st, err := s.open(ctx)
	path := s.filePath()
	if err != nil || path == "" || st.(*store.File).Epoch() == epoch {
		return st, err
	}
	if err := st.Close(); err != nil {
		return nil, err
	}
	if err := store.SetFileEpoch(path, epoch); err != nil {
		return nil, err
	}
	return s.open(ctx)
}

// heads lists the rooms st holds: room → epoch and head.
func heads(ctx context.Context, st store.Importer) (map[string]roomHead, error) {
	out := map[string]roomHead{}
	err := st.Rooms(ctx, func(room, epoch string, head uint64) error {
		out[room] = roomHead{epoch, head}
		return nil
	})
	return out, err
}

type roomHead struct {
	epoch string
	head  uint64
}

// progress reports on errOut at most once a second, and at the end.
type progress struct {
	what           string
	out            io.Writer
	start, last    time.Time
	rooms, skipped int
	bytes          int64
}

func (p *progress) room(img *store.RoomImage, skipped bool) {
	p.rooms++
	if skipped {
		p.skipped++
	}
	for i := range img.Items {
		p.bytes += int64(len(img.Items[i].Key) + len(img.Items[i].Value))
	}
	for i := range img.History {
		p.bytes += store.BatchBytes(img.History[i].Events)
	}
	if time.Since(p.last) >= time.Second {
		p.last = time.Now()
		p.report()
	}
}

func (p *progress) report() {
	d := time.Since(p.start)
	fmt.Fprintf(p.out, "%s: %d rooms (%d already there), %s, %s\n", p.what, p.rooms, p.skipped, sizeRate(p.bytes, d), roomRate(p.rooms, d))
}

// importers is how many rooms are written at once: a file store commits
// the rooms written together in one transaction (one fsync), Redis gets
// them in parallel.
const importers = 8

// importer writes rooms into dst from importers goroutines. put hands it
// a room (it blocks while all are busy, or returns the first failure);
// wait waits for the rooms handed so far.
type importer struct {
	ch          chan *store.RoomImage
	closeOnce   sync.Once
	g           *errgroup.Group
	ctx, parent context.Context // the group's, cancelled by a failure or by wait; the caller's
	mu          sync.Mutex
	p           *progress
}

func newImporter(ctx context.Context, dst store.Importer, p *progress) *importer {
	g, gctx := errgroup.WithContext(ctx)
	ch := make(chan *store.RoomImage)
	im := &importer{ch: ch, g: g, ctx: gctx, parent: ctx, p: p}
	for range importers {
		g.Go(func() error {
			for img := range ch {
				if err := dst.Import(gctx, img); err != nil {
					return err
				}
				im.mu.Lock()
				p.room(img, false)
				im.mu.Unlock()
			}
			return nil
		})
	}
	return im
}

func (im *importer) put(img *store.RoomImage) error {
	select {
	case im.ch <- img:
		return nil
	case <-im.ctx.Done():
		return im.wait()
	}
}

func (im *importer) skip(img *store.RoomImage) {
	im.mu.Lock()
	im.p.room(img, true)
	im.mu.Unlock()
}

// wait ends the importer and returns its first failure.
func (im *importer) wait() error {
	im.closeOnce.Do(func() { close(im.ch) })
	if err := im.g.Wait(); err != nil {
		return err
	}
	return im.parent.Err()
}

// restore writes the backup in file into an empty store, under a new
// epoch: clients that saw the source get a snapshot, never a replay of
// revisions that may differ from what they saw.
func restore(ctx context.Context, spec storeSpec, file string, errOut io.Writer) error {
	v, err := verifyFile(file)
	if err != nil {
		return fmt.Errorf("restore: %s: %w", file, err)
	}
	h, n := v.Header, v.Rooms()
	rec := carry(v.Sessions, v.Leases)
	st, err := spec.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	have, err := heads(ctx, st)
	if err != nil {
		return err
	}
	if len(have) > 0 {
		return fmt.Errorf("restore: the store holds %d rooms: restore only into an empty store", len(have))
	}
	// A new epoch: Redis takes it per room; a file store has its own, new
	// with the file, unless it is the backup's (a copy of the source).
	epoch := store.NewEpoch()
	if fst, ok := st.(*store.File); ok {
		if fst.Epoch() != h.Epoch {
			epoch = fst.Epoch()
		} else {
			if err := st.Close(); err != nil {
				return err
			}
			if st, err = spec.openWithEpoch(ctx, epoch); err != nil {
				return err
			}
			defer st.Close()
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	br, err := store.NewBackupReader(f)
	if err != nil {
		return err
	}
	fmt.Fprintf(errOut, "restore: %d rooms of a %s store backed up at %s, new epoch %s\n", n, h.Store, h.Time.Format(time.RFC3339), epoch)
	p := &progress{what: "restore", out: errOut, start: time.Now(), last: time.Now()}
	im := newImporter(ctx, st, p)
	for {
		img, err := br.Next()
		if err == io.EOF {
			break
		}
		if err == nil {
			img.Epoch = epoch
			store.CarryLeases(img, rec.names, rec.keys)
			err = im.put(img)
		}
		if err != nil {
			_ = im.wait()
			return fmt.Errorf("restore: %w", err)
		}
	}
	if err := im.wait(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	p.report()
	if err := rec.write(ctx, "restore", st, errOut); err != nil {
		return err
	}
	return st.Close()
}

// migrate copies every room of from into to, keeping its epoch, so that
// clients resume by replay where the history came along. Rooms already at
// the destination with the source's epoch and head are skipped: a
// migration cut halfway is run again to finish.
func migrate(ctx context.Context, fromSpec, toSpec storeSpec, force bool, errOut io.Writer) error {
	if fromSpec.arg == toSpec.arg {
		return errors.New("migrate: --from and --to are the same store")
	}
	src, err := fromSpec.open(ctx)
	if err != nil {
		return fmt.Errorf("migrate: --from: %w", err)
	}
	defer src.Close()
	srcHeads, err := heads(ctx, src)
	if err != nil {
		return err
	}
	var dst backupStore
	if epoch := src.BackupHeader().Epoch; epoch != "" {
		dst, err = toSpec.openWithEpoch(ctx, epoch)
	} else {
		dst, err = toSpec.open(ctx)
	}
	if err != nil {
		return fmt.Errorf("migrate: --to: %w", err)
	}
	defer dst.Close()
	dstHeads, err := heads(ctx, dst)
	if err != nil {
		return err
	}
	foreign := 0
	for room, h := range dstHeads {
		if s, ok := srcHeads[room]; !ok || s.epoch != h.epoch {
			foreign++
		}
	}
	if foreign > 0 && !force {
		return fmt.Errorf("migrate: the destination holds %d rooms that are not from this source (use --force to replace them)", foreign)
	}
	rec, err := sourceRecords(ctx, src)
	if err != nil {
		return fmt.Errorf("migrate: --from: %w", err)
	}
	fmt.Fprintf(errOut, "migrate: %d rooms from %s to %s (%d already there)\n", len(srcHeads), src.BackupHeader().Store, dst.BackupHeader().Store, len(dstHeads)-foreign)
	p := &progress{what: "migrate", out: errOut, start: time.Now(), last: time.Now()}
	// A pause per room copied, for the tests that cut a migration halfway.
	pause, _ := time.ParseDuration(os.Getenv("STATECAST_TEST_MIGRATE_ROOM_PAUSE"))
	im := newImporter(ctx, dst, p)
	err = src.Export(ctx, func(img *store.RoomImage) error {
		time.Sleep(pause)
		store.CarryLeases(img, rec.names, rec.keys)
		if h, ok := dstHeads[img.Room]; ok && h.epoch == img.Epoch && h.head == img.Head {
			im.skip(img)
			return nil
		}
		return im.put(img)
	})
	if werr := im.wait(); err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	p.report()
	if err := rec.write(ctx, "migrate", dst, errOut); err != nil {
		return err
	}
	return dst.Close()
}

// records are the sessions and TTL leases a restore or a migration
// carries, and the keys bound to them in the rooms carried.
type records struct {
	sessions []store.SessionRecord
	leases   []store.LeaseRecord
	names    map[string]bool             // their lease names
	keys     map[string][]store.LeaseKey // lease id → its keys
}

func carry(sessions []store.SessionRecord, leases []store.LeaseRecord) *records {
	r := &records{sessions: sessions, leases: leases, names: map[string]bool{}, keys: map[string][]store.LeaseKey{}}
	for _, s := range sessions {
		r.names[s.Lease] = true
	}
	for _, l := range leases {
		r.names[l.ID] = true
	}
	return r
}

// sourceRecords reads the sessions and TTL leases of a migration's source.
// Each session's grace starts again when the first server starts on the
// destination, as after a restart of the file store: the source's
// servers are stopped, and their clients come back to the destination's.
// A lease keeps its deadline.
func sourceRecords(ctx context.Context, src backupStore) (*records, error) {
	var sessions []store.SessionRecord
	if ss, ok := src.(store.Sessions); ok {
		var err error
		if sessions, err = ss.ListSessions(ctx); err != nil {
			return nil, err
		}
	}
	for i := range sessions {
		sessions[i].Owner, sessions[i].Gen, sessions[i].Deadline, sessions[i].Listed = "", 0, 0, false
	}
	var leases []store.LeaseRecord
	if lk, ok := src.(interface {
		LeaseRecords(context.Context) ([]store.LeaseRecord, error)
	}); ok {
		var err error
		if leases, err = lk.LeaseRecords(ctx); err != nil {
			return nil, err
		}
	}
	return carry(sessions, leases), nil
}

// write imports the records into dst, after the rooms, and says what will
// become of them.
func (r *records) write(ctx context.Context, what string, dst backupStore, errOut io.Writer) error {
	if len(r.sessions) == 0 && len(r.leases) == 0 {
		return nil
	}
	ri, ok := dst.(store.RecordImporter)
	if !ok {
		return fmt.Errorf("%s: the destination cannot keep sessions and leases", what)
	}
	if err := ri.ImportRecords(ctx, r.sessions, r.leases, r.keys); err != nil {
		return fmt.Errorf("%s: sessions and leases: %w", what, err)
	}
	now := time.Now().UnixMilli()
	ended, endedLeases := 0, 0
	for _, s := range r.sessions {
		if s.Deadline != 0 && s.Deadline <= now {
			ended++
		}
	}
	for _, l := range r.leases {
		if l.Deadline <= now {
			endedLeases++
		}
	}
	fmt.Fprintf(errOut, "%s: %d sessions (%d past their grace: they end when a server starts), %d TTL leases (%d past their deadline: they end when a server starts)\n",
		what, len(r.sessions), ended, len(r.leases), endedLeases)
	return nil
}
