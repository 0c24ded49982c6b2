package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TLS is a throwaway certificate authority and the files redis-server and
// its clients need: servers started with Options.TLS listen with TLS only
// and ask every client for a certificate (redis.conf's default
// tls-auth-clients yes); replicas and Sentinels reach them with TLS too.
type TLS struct {
	CA         string // the CA's certificate (PEM)
	Cert, Key  string // a certificate for 127.0.0.1, for servers and clients alike
	clientConf *tls.Config
}

// NewTLS writes a CA and a certificate it signed into a directory of t.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		// Servers present it, and so do replicas and Sentinels reaching them.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := &TLS{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "redis.pem"), Key: filepath.Join(dir, "redis.key")}
	for _, f := range []struct {
		path, kind string
		der        []byte
	}{{c.CA, "CERTIFICATE", caDER}, {c.Cert, "CERTIFICATE", der}, {c.Key, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	c.clientConf = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	return c
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Query is the store URL's query that names c's files.
func (c *TLS) Query() string {
	return "tls_ca_cert_file=" + c.CA + "&tls_cert_file=" + c.Cert + "&tls_key_file=" + c.Key
}

// args are a TLS-only server's arguments for port.
func (c *TLS) args(port int) []string {
	return []string{"--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", c.Cert, "--tls-key-file", c.Key, "--tls-ca-cert-file", c.CA,
		"--tls-replication", "yes"}
}

// tlsAddrs holds the client settings of the servers that listen with TLS,
// by address, for Do.
var tlsAddrs sync.Map

func dial(addr string) (net.Conn, error) {
	if c, ok := tlsAddrs.Load(addr); ok {
		return tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, c.(*tls.Config))
	}
	return net.DialTimeout("tcp", addr, time.Second)
}
