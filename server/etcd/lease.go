package etcd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/wire"
)

// serveStream runs a bidirectional stream of caller c: each request
// received is handled in order, on the RPC's goroutine, until the client
// ends the stream, handle fails, the server stops, or c's token expires
// (as a WebSocket session or an SSE stream ends then).
func serveStream[Req any](s *Server, ctx context.Context, c caller, recv func() (*Req, error), handle func(*Req) error) error {
	if !s.stream() {
		return errStopping
	}
	defer s.streams.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var expired <-chan time.Time
	if until := s.node.ValidUntil(c.claims); !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		expired = t.C
	}
	reqs, errc := make(chan *Req), make(chan error, 1)
	go func() {
		for {
			r, err := recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-s.quit:
			return errStopping
		case <-expired:
			return status.Error(codes.Unauthenticated, "statecast: token expired; open the stream again with a new token")
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case r := <-reqs:
			if err := handle(r); err != nil {
				return err
			}
		}
	}
}

type leaseServer struct {
	pb.UnimplementedLeaseServer
	*Server
}

// maxLeaseTTL is the node's (server.GrantLease); etcd's own is far longer.
const maxLeaseTTL = time.Hour

func (s leaseServer) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	if r.ID != 0 {
		return nil, status.Error(codes.InvalidArgument, "statecast: the server chooses lease ids: send ID 0")
	}
	if r.TTL > int64(maxLeaseTTL/time.Second) { // before multiplying: a huge TTL would wrap around
		return nil, rpctypes.ErrGRPCLeaseTTLTooLarge
	}
	ttl := time.Duration(max(r.TTL, 1)) * time.Second
	// Random, so unguessable as the node's other lease ids; positive, as
	// etcd's are.
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := int64(binary.BigEndian.Uint64(b[:])>>1) | 1
	if err := s.node.GrantLease(ctx, leaseName(id), ttl, c.claims, c.addr); err != nil {
		return nil, grpcError(err)
	}
	return &pb.LeaseGrantResponse{Header: s.header(0), ID: id, TTL: int64(ttl / time.Second)}, nil
}

func (s leaseServer) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.node.RevokeLease(ctx, leaseName(r.ID), c.claims, c.addr); err != nil {
		return nil, grpcError(err)
	}
	return &pb.LeaseRevokeResponse{Header: s.header(0)}, nil
}

// notFound says whether err is the node's answer for a lease that has
// ended (or never was).
func notFound(err error) bool {
	var pe *server.Error
	return errors.As(err, &pe) && pe.Code == wire.CodeNotFound
}

// LeaseKeepAlive answers each request with the lease's TTL; a lease that
// has ended answers TTL 0, as etcd does (its clients then stop).
func (s leaseServer) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	c, err := s.caller(stream.Context())
	if err != nil {
		return err
	}
	return serveStream(s.Server, stream.Context(), c, stream.Recv, func(r *pb.LeaseKeepAliveRequest) error {
		ttl, err := s.node.KeepAliveLease(stream.Context(), leaseName(r.ID), c.claims)
		if err != nil && !notFound(err) {
			return grpcError(err)
		}
		return stream.Send(&pb.LeaseKeepAliveResponse{Header: s.header(0), ID: r.ID, TTL: int64(ttl / time.Second)})
	})
}

func (s leaseServer) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	info, err := s.node.Lease(ctx, leaseName(r.ID), c.claims)
	switch {
	case notFound(err):
		return &pb.LeaseTimeToLiveResponse{Header: s.header(0), ID: r.ID, TTL: -1}, nil
	case err != nil:
		return nil, grpcError(err)
	}
	resp := &pb.LeaseTimeToLiveResponse{Header: s.header(0), ID: r.ID, GrantedTTL: int64(info.TTL / time.Second), TTL: int64(info.Left / time.Second)}
	if info.Left < 0 {
		resp.TTL = resp.GrantedTTL // the node cannot tell (shared store): at most this
	}
	if r.Keys {
		// Its keys are a reply like a range's: bounded (counted before
		// any is built), and held in the node's reply budget until sent.
		var n int64
		readable := info.Keys[:0:0]
		for _, k := range info.Keys {
			if c.claims.CanRead(k[0], k[1]) { // the lease is the subject's; its keys' names are reads
				readable = append(readable, k)
				n += int64(len(s.prefixOf(k[0]))+len(etcdKey(k[1]))) + kvOverhead
			}
		}
		if n > s.maxReply {
			return nil, s.tooLarge("this lease's keys", n, "ask for its time to live without keys, and range the keys its rooms hold")
		}
		if err := s.holdReply(ctx, n); err != nil {
			return nil, err
		}
		for _, k := range readable {
			resp.Keys = append(resp.Keys, []byte(s.prefixOf(k[0])+etcdKey(k[1])))
		}
	}
	return resp, nil
}

func (s leaseServer) LeaseLeases(ctx context.Context, r *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	ids, err := s.node.Leases(ctx, leasePrefix, c.claims)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &pb.LeaseLeasesResponse{Header: s.header(0)}
	for _, id := range ids {
		if n, err := strconv.ParseUint(strings.TrimPrefix(id, leasePrefix), 16, 64); err == nil {
			resp.Leases = append(resp.Leases, &pb.LeaseStatus{ID: int64(n)})
		}
	}
	return resp, nil
}

// maintenanceServer answers what etcdctl endpoint status and health ask:
// this node is a cluster of one, its own leader, with no alarms.
type maintenanceServer struct {
	pb.UnimplementedMaintenanceServer
	*Server
}

// apiVersion is the etcd version whose API is served (what etcdctl
// endpoint status shows as the version).
const apiVersion = "3.5.0"

func (s maintenanceServer) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	if _, err := s.caller(ctx); err != nil {
		return nil, err
	}
	return &pb.StatusResponse{Header: s.header(0), Version: apiVersion, Leader: s.member, RaftTerm: 1, RaftIndex: 1, RaftAppliedIndex: 1}, nil
}

func (s maintenanceServer) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	if _, err := s.caller(ctx); err != nil {
		return nil, err
	}
	return &pb.AlarmResponse{Header: s.header(0)}, nil
}
