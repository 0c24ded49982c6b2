package server

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/trace"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/wire"
)

// registerHooks puts the hooks' metrics on the server's registry.
func registerHooks(cfg Config) error {
	if cfg.Validate != nil {
		for _, c := range cfg.Validate.Collectors() {
			if err := cfg.Registerer.Register(c); err != nil {
				return err
			}
		}
	}
	if cfg.Connect != nil {
		for _, c := range cfg.Connect.Collectors() {
			if err := cfg.Registerer.Register(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// authEnabled: clients must prove who they are, with a token or, where a
// connect hook is configured, with the application's own session.
func (s *Server) authEnabled() bool { return s.cfg.Auth != nil || s.cfg.Connect != nil }

// identify returns the claims of a client that presents token (maybe
// none) with the request header fields header: a token is verified; no
// token, with a connect hook configured, asks the hook. transport and addr
// describe the client to the hook.
func (s *Server) identify(ctx context.Context, token string, header http.Header, transport, addr string) (*auth.Claims, error) {
	if token != "" || s.cfg.Connect == nil {
		return s.verify(token)
	}
	ctx, span := s.startSpan(ctx, "hook.connect", trace.SpanKindClient, "")
	claims, err := s.cfg.Connect.Authenticate(ctx, hooks.ConnectRequest{Transport: transport, Addr: addr}, header)
	endSpan(span, err)
	return claims, err
}

// hookHeader keeps, of an upgrade request, what the connect hook is
// sent when the client's connect message carries no token.
func (s *Server) hookHeader(r *http.Request) http.Header {
	if s.cfg.Connect == nil {
		return nil
	}
	h := make(http.Header, len(hooks.ForwardedHeaders))
	for _, name := range hooks.ForwardedHeaders {
		if vs := r.Header.Values(name); len(vs) > 0 {
			h[http.CanonicalHeaderKey(name)] = append([]string(nil), vs...)
		}
	}
	return h
}

// connectRefusal is how a WebSocket that identify did not let in is
// closed: a connect hook that did not answer is worth a retry (1013), a
// refusal is not (4501), an expired token is refreshed (4002).
func connectRefusal(err error) error {
	switch {
	case errors.Is(err, hooks.ErrUnavailable):
		return closeWith(websocket.StatusTryAgainLater, "the application's connect hook did not answer; retry")
	case errors.Is(err, auth.ErrTokenExpired):
		return closeWith(wire.CloseTokenExpired, "token expired")
	case errors.Is(err, hooks.ErrRefused):
		return closeWith(wire.CloseUnauthorized, "unauthorized: the application did not recognise the session")
	}
	return closeWith(wire.CloseUnauthorized, "unauthorized: %v", err)
}
