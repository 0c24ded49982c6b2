package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/hooks/hookstest"
)

// webhookReceiver is the hidden "statecast webhook-receiver" command: a
// receiver process for the tests and the figures. It verifies every
// delivery's signature (401 otherwise), appends it to --log as a JSON line
// (hookstest.Record) and answers --status after --delay.
func webhookReceiver(args []string) error {
	fs := flag.NewFlagSet("webhook-receiver", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	secretValue := fs.String("secret", "", "the webhooks' signing key")
	secretFile := fs.String("secret-file", "", "file holding the signing key")
	logPath := fs.String("log", "", "append every verified delivery here (JSON lines)")
	status := fs.Int("status", http.StatusOK, "status to answer (0: never answer)")
	delay := fs.Duration("delay", 0, "wait this long before answering")
	if err := fs.Parse(args); err != nil {
		return err
	}
	key, err := secret(*secretValue, *secretFile)
	if err != nil || key == "" {
		return errors.Join(err, errors.New("webhook-receiver: --secret or --secret-file is required"))
	}
	rc := &hookstest.Receiver{Secret: []byte(key), Respond: func(*hooks.Delivery) int {
		time.Sleep(*delay)
		return *status
	}}
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		rc.Log = f
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Printf("webhook-receiver listening on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
