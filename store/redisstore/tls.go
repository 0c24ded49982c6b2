package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// A Redis that serves TLS with its own CA, or that asks clients for a
// certificate (redis.conf's tls-auth-clients, on by default), needs files
// the system's trust store does not hold. Every store URL takes them as
// query parameters, named as redis.conf names its own, so that every
// command taking a store URL (serve, backup, restore, migrate) reaches
// such a Redis without a flag of its own:
//
//	rediss://host:6380/0?tls_ca_cert_file=ca.pem&tls_cert_file=c.pem&tls_key_file=c.key
var tlsParams = []string{"tls_ca_cert_file", "tls_cert_file", "tls_key_file"}

// tlsFiles are the TLS parameters of a store URL.
type tlsFiles struct{ ca, cert, key string }

func (f tlsFiles) set() bool { return f != tlsFiles{} }

// cutTLSParams removes the TLS parameters from raw's query (go-redis
// refuses parameters it does not know) and returns them.
func cutTLSParams(raw string) (string, tlsFiles, error) {
	base, query, ok := strings.Cut(raw, "?")
	if !ok {
		return raw, tlsFiles{}, nil
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return raw, tlsFiles{}, fmt.Errorf("store: redis url: %w", err)
	}
	var f tlsFiles
	for i, p := range []*string{&f.ca, &f.cert, &f.key} {
		if v, ok := q[tlsParams[i]]; ok {
			*p = v[len(v)-1]
			q.Del(tlsParams[i])
		}
	}
	if (f.cert == "") != (f.key == "") {
		return raw, tlsFiles{}, errors.New("store: redis url: tls_cert_file and tls_key_file go together")
	}
	if len(q) == 0 {
		return base, f, nil
	}
	return base + "?" + q.Encode(), f, nil
}

// configure adds f's CA and client certificate to c, the TLS settings of
// a rediss:// URL; a URL without TLS is refused, as its files would
// silently go unused.
func (f tlsFiles) configure(c *tls.Config) error {
	if !f.set() {
		return nil
	}
	if c == nil {
		return errors.New("store: redis url: TLS files are given, but the URL does not use TLS (rediss://, rediss+sentinel://)")
	}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return fmt.Errorf("store: redis tls_ca_cert_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("store: redis tls_ca_cert_file %s: no PEM certificate in it", f.ca)
		}
		c.RootCAs = pool
	}
	if f.cert != "" {
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return fmt.Errorf("store: redis tls_cert_file/tls_key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return nil
}
