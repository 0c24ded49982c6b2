// Package hookstest is a webhook receiver for tests: it verifies each
// delivery's signature, records it, answers as told, and checks the
// records against the delivery guarantees (Check).
package hookstest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/statecast/statecast/server/hooks"
)

// Record is one POST the receiver verified, in arrival order. Status is
// what it answered (0: it died or gave up before answering).
type Record struct {
	Status   int            `json:"status"`
	Received int64          `json:"received_us"` // arrival, Unix microseconds
	Key      string         `json:"key"`         // Statecast-Delivery
	Delivery hooks.Delivery `json:"delivery"`
}

// Receiver is an http.Handler that verifies and records deliveries.
type Receiver struct {
	Secret []byte
	// Respond, when set, says what to answer a verified delivery (after it
	// is recorded); default 200.
	Respond func(d *hooks.Delivery) int
	// Log, when set, gets each record as a JSON line before the answer
	// (the receiver process's log, read by the tests after it is killed).
	Log io.Writer

	mu      sync.Mutex
	records []Record
	forged  int
}

func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := hooks.VerifyRequest(r, rc.Secret, 0, 0)
	if err != nil {
		rc.mu.Lock()
		rc.forged++
		rc.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rec := Record{Status: http.StatusOK, Key: r.Header.Get(hooks.DeliveryHeader), Received: time.Now().UnixMicro()}
	if err := json.Unmarshal(body, &rec.Delivery); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if rc.Respond != nil {
		rec.Status = rc.Respond(&rec.Delivery)
	}
	rc.mu.Lock()
	rc.records = append(rc.records, rec)
	if rc.Log != nil {
		line, _ := json.Marshal(rec)
		_, _ = rc.Log.Write(append(line, '\n'))
	}
	rc.mu.Unlock()
	if rec.Status == 0 {
		<-r.Context().Done() // never answered: the caller gives up
		return
	}
	w.WriteHeader(rec.Status)
}

// Records returns what was received so far.
func (rc *Receiver) Records() []Record {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]Record(nil), rc.records...)
}

// Forged returns how many requests failed verification.
func (rc *Receiver) Forged() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.forged
}

// ReadLog parses the JSON lines a Receiver wrote to its Log (a last line
// cut by a kill is ignored).
func ReadLog(b []byte) []Record {
	var out []Record
	for _, line := range bytes.Split(b, []byte("\n")) {
		var rec Record
		if len(line) > 0 && json.Unmarshal(line, &rec) == nil {
			out = append(out, rec)
		}
	}
	return out
}

// Want is what a room must have been delivered: every revision up to Rev
// of its last epoch.
type Want struct {
	Rev uint64
	// Snapshots allowed (a new epoch, compacted history); without, a
	// snapshot is an error.
	Snapshots bool
}

// Check verifies records against the guarantees, per room: revisions in
// order (a delivery never skips past what was acknowledged), duplicates
// only as repeats of the same revision with the same events, another epoch
// only after a snapshot or from its revision 1, and every revision up to
// want's, of the last epoch, acknowledged.
func Check(records []Record, want map[string]Want) error {
	type state struct {
		epoch string
		acked uint64
	}
	rooms := make(map[string]*state)
	seen := make(map[string][]byte) // room@epoch:rev → events
	var errs []error
	for i, rec := range records {
		d := &rec.Delivery
		st := rooms[d.Room]
		if st == nil {
			st = &state{}
			rooms[d.Room] = st
		}
		if rec.Key != d.Key() {
			errs = append(errs, fmt.Errorf("record %d: header %s names %q, body is %q", i, hooks.DeliveryHeader, rec.Key, d.Key()))
		}
		if d.Type == hooks.TypeSnapshot {
			if !want[d.Room].Snapshots {
				errs = append(errs, fmt.Errorf("record %d: unexpected snapshot of %s (%s) at %d", i, d.Room, d.Reason, d.ToRev))
			}
			if rec.Status/100 == 2 {
				st.epoch, st.acked = d.Epoch, d.ToRev
			}
			continue
		}
		if st.epoch != "" && d.Epoch != st.epoch {
			// A new epoch delivered from its first revision needs no
			// snapshot: the room started over empty (its cursors went
			// with it, as on a flushed Redis).
			if d.FromRev != 1 {
				errs = append(errs, fmt.Errorf("record %d: %s moved from epoch %s to %s at %d without a snapshot", i, d.Room, st.epoch, d.Epoch, d.FromRev))
			}
			st.acked = 0
		}
		if d.FromRev > st.acked+1 {
			errs = append(errs, fmt.Errorf("record %d: %s: revisions %d-%d after %d acknowledged: a gap", i, d.Room, d.FromRev, d.ToRev, st.acked))
		}
		for j, r := range d.Revisions {
			if r.Rev != d.FromRev+uint64(j) || r.Rev > d.ToRev {
				errs = append(errs, fmt.Errorf("record %d: %s: revision %d at place %d of %d-%d", i, d.Room, r.Rev, j, d.FromRev, d.ToRev))
			}
			evs, _ := json.Marshal(r.Events)
			k := fmt.Sprintf("%s@%s:%d", d.Room, d.Epoch, r.Rev)
			if prev, ok := seen[k]; ok && !bytes.Equal(prev, evs) {
				errs = append(errs, fmt.Errorf("record %d: %s delivered twice with other events: %s, then %s", i, k, prev, evs))
			}
			seen[k] = evs
		}
		if rec.Status/100 == 2 {
			st.epoch, st.acked = d.Epoch, max(st.acked, d.ToRev)
		}
		if len(errs) > 10 {
			break
		}
	}
	for room, w := range want {
		if st := rooms[room]; st == nil || st.acked != w.Rev {
			got := uint64(0)
			if st != nil {
				got = st.acked
			}
			errs = append(errs, fmt.Errorf("%s: acknowledged up to %d, want %d", room, got, w.Rev))
		}
	}
	return errors.Join(errs...)
}

// Wait polls check every 20 ms until it returns nil or timeout passes, and
// returns its last error.
func Wait(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
