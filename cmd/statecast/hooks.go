package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/statecast/statecast/demo"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/server/hooks"
)

// hookConfig builds the validation and connect hooks of the flags, and
// starts the lobby demo's backend when --demo-hooks asks for it; stop
// stops that backend.
func hookConfig(f serveFlags, engine *rooms.Engine, log *slog.Logger) (*hooks.Validator, *hooks.Connector, func(), error) {
	stop := func() {}
	routes, err := hooks.ParseRoutes(f.hookValidate)
	if err != nil {
		return nil, nil, stop, err
	}
	key, err := secret(f.hookSecret, f.hookSecretFile)
	if err != nil {
		return nil, nil, stop, err
	}
	if key == "" && (len(routes) > 0 || f.hookConnect != "") {
		return nil, nil, stop, errors.New("--hook-validate and --hook-connect sign their requests: give --hook-secret-file (or --hook-secret)")
	}
	if f.demoHooks {
		demoKey := []byte(key)
		if key == "" {
			demoKey = make([]byte, 32)
			_, _ = rand.Read(demoKey) // the demo's backend is the only receiver
		}
		url, stopDemo, err := startLobbyHooks(demoKey, engine, log)
		if err != nil {
			return nil, nil, stop, err
		}
		stop = stopDemo
		key = string(demoKey)
		routes = append(routes, hooks.Route{Pattern: demo.LobbyHookRooms, URL: url})
		log.Info("the lobby demo's backend validates writes to "+demo.LobbyHookRooms+" rooms (--demo-hooks=false turns it off)", "url", url)
	}
	var v *hooks.Validator
	if len(routes) > 0 {
		if v, err = hooks.NewValidator(hooks.ValidatorConfig{Routes: routes, Secret: []byte(key), Timeout: f.hookTimeout}); err != nil {
			return nil, nil, stop, err
		}
	}
	var c *hooks.Connector
	if f.hookConnect != "" {
		if c, err = hooks.NewConnector(hooks.ConnectorConfig{URL: f.hookConnect, Secret: []byte(key), Timeout: f.hookTimeout}); err != nil {
			return nil, nil, stop, err
		}
	}
	return v, c, stop, nil
}

// startLobbyHooks serves the lobby's backend (demo.LobbyHooks) on a
// loopback port and returns its validation URL: the node calls it over
// HTTP like any application's backend.
func startLobbyHooks(secret []byte, engine *rooms.Engine, log *slog.Logger) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	read := func(ctx context.Context, room, key string) (json.RawMessage, uint64, error) {
		snap, err := engine.Get(ctx, room, key, rooms.ReadOptions{})
		if err != nil || len(snap.Items) == 0 {
			return nil, 0, err
		}
		return snap.Items[0].Value, snap.Items[0].ModRev, nil
	}
	hs := &http.Server{Handler: &demo.LobbyHooks{Secret: secret, Read: read}, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the lobby demo's backend stopped", "err", err)
		}
	}()
	return "http://" + ln.Addr().String() + "/validate", func() { _ = hs.Close() }, nil
}
