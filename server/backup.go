package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// handleBackup streams a backup of the store (docs/BACKUP.md), with the
// inspector's admin rights. Once the first byte is sent the status cannot
// change: a backup that fails halfway ends without its trailer, which a
// reader refuses.
func (s *Server) handleBackup(c echo.Context) error {
	if err := s.checkAdmin(c.Request()); err != nil {
		return err
	}
	ex, ok := s.store.(store.Exporter)
	if !ok {
		return newError(wire.CodeBadRequest, "this store cannot be backed up")
	}
	h := ex.BackupHeader()
	h.Time = time.Now().UTC()
	resp := c.Response()
	resp.Header().Set(echo.HeaderContentType, "application/x-ndjson")
	resp.Header().Set(echo.HeaderCacheControl, "no-store")
	resp.WriteHeader(http.StatusOK)
	bw, err := store.NewBackupWriter(resp, h)
	if err == nil {
		err = ex.Export(c.Request().Context(), bw.Room)
	}
	if err == nil {
		err = s.backupRecords(c.Request().Context(), bw, h.Time)
	}
	if err == nil {
		err = bw.Close()
	}
	if err != nil {
		s.log.Error("backup failed", "err", err, "rooms", bw.Rooms())
	}
	return nil
}

// backupRecords writes the session and TTL lease records, read after the
// rooms. A session attached at the backup gets the deadline it would have
// had if its socket had closed then: restored later than a grace after
// the backup, it ends at the first start instead of being resumed
// (docs/BACKUP.md).
func (s *Server) backupRecords(ctx context.Context, bw *store.BackupWriter, at time.Time) error {
	var sessions []store.SessionRecord
	if ss, ok := s.store.(store.Sessions); ok {
		var err error
		if sessions, err = ss.ListSessions(ctx); err != nil {
			return err
		}
	}
	for i := range sessions {
		if sessions[i].Deadline == 0 {
			sessions[i].Deadline = at.Add(s.sessions.grace).UnixMilli()
		}
	}
	leases := s.leases.ttlRecords()
	if s.leases.shared != nil {
		lk, ok := s.store.(interface {
			LeaseRecords(context.Context) ([]store.LeaseRecord, error)
		})
		if !ok {
			return errors.New("server: this store's TTL leases cannot be backed up")
		}
		var err error
		if leases, err = lk.LeaseRecords(ctx); err != nil {
			return err
		}
	}
	return bw.Records(sessions, leases)
}
