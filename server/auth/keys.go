package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// algKind names the key type each supported algorithm needs.
var algKind = map[string]string{
	"HS256": "hmac", "HS384": "hmac", "HS512": "hmac",
	"RS256": "rsa", "RS384": "rsa", "RS512": "rsa",
	"PS256": "rsa", "PS384": "rsa", "PS512": "rsa",
	"ES256": "P-256", "ES384": "P-384", "ES512": "P-521",
	"EdDSA": "ed25519",
}

// hmacMinBytes is RFC 7518 section 3.2's minimum secret length.
var hmacMinBytes = map[string]int{"HS256": 32, "HS384": 48, "HS512": 64}

// keyring is the configured key material, grouped by kind.
type keyring struct {
	hmac    []byte
	rsa     []*rsa.PublicKey
	ec      map[string][]*ecdsa.PublicKey // by curve name
	ed25519 []ed25519.PublicKey
	natural []string // natural algorithms, in the order the keys appear
}

// forAlg returns the keys alg verifies with, or why alg cannot be allowed.
func (ks *keyring) forAlg(alg string) (jwt.VerificationKeySet, error) {
	var set jwt.VerificationKeySet
	kind, ok := algKind[alg]
	if !ok {
		if strings.EqualFold(alg, "none") {
			return set, errors.New(`server: auth: algorithm "none" is never allowed`)
		}
		return set, fmt.Errorf("server: auth: unknown or unsupported algorithm %q (supported: HS256/384/512, RS256/384/512, PS256/384/512, ES256/384/512, EdDSA)", alg)
	}
	switch kind {
	case "hmac":
		if ks.hmac == nil {
			return set, fmt.Errorf("server: auth: algorithm %s needs HMACSecret", alg)
		}
		if n := hmacMinBytes[alg]; len(ks.hmac) < n {
			return set, fmt.Errorf("server: auth: HMACSecret of %d bytes is too short for %s (RFC 7518 requires at least %d)", len(ks.hmac), alg, n)
		}
		set.Keys = append(set.Keys, ks.hmac)
	case "rsa":
		for _, k := range ks.rsa {
			set.Keys = append(set.Keys, k)
		}
	case "ed25519":
		for _, k := range ks.ed25519 {
			set.Keys = append(set.Keys, k)
		}
	default: // an ECDSA curve
		for _, k := range ks.ec[kind] {
			set.Keys = append(set.Keys, k)
		}
	}
	if len(set.Keys) == 0 {
		return set, fmt.Errorf("server: auth: algorithm %s needs a %s public key in PublicKeyPEM, and none is configured", alg, strings.ToUpper(kind))
	}
	return set, nil
}

// addPEM reads every PEM block of data as a public key.
func (ks *keyring) addPEM(data []byte) error {
	rest := data
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		n++
		var (
			pub any
			err error
		)
		switch block.Type {
		case "PUBLIC KEY":
			pub, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				pub = cert.PublicKey
			}
		default:
			if strings.Contains(block.Type, "PRIVATE") {
				return fmt.Errorf("server: auth: PublicKeyPEM block %d is a %s: give the public key only", n, block.Type)
			}
			return fmt.Errorf("server: auth: PublicKeyPEM block %d has unsupported type %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", n, block.Type)
		}
		if err != nil {
			return fmt.Errorf("server: auth: PublicKeyPEM block %d (%s): %v", n, block.Type, err)
		}
		if err := ks.addKey(n, pub); err != nil {
			return err
		}
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		if n == 0 {
			return errors.New("server: auth: PublicKeyPEM holds no PEM block")
		}
		return fmt.Errorf("server: auth: PublicKeyPEM has unreadable data after block %d", n)
	}
	if n == 0 {
		return errors.New("server: auth: PublicKeyPEM holds no PEM block")
	}
	return nil
}

// addKey files one parsed public key under its kind.
func (ks *keyring) addKey(n int, pub any) error {
	natural := ""
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < 2048 {
			return fmt.Errorf("server: auth: PublicKeyPEM block %d: RSA key of %d bits is too small (RFC 7518 requires at least 2048)", n, bits)
		}
		ks.rsa = append(ks.rsa, k)
		natural = "RS256"
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			natural = "ES256"
		case elliptic.P384():
			natural = "ES384"
		case elliptic.P521():
			natural = "ES512"
		default:
			return fmt.Errorf("server: auth: PublicKeyPEM block %d: unsupported ECDSA curve %s", n, k.Curve.Params().Name)
		}
		name := k.Curve.Params().Name
		ks.ec[name] = append(ks.ec[name], k)
	case ed25519.PublicKey:
		ks.ed25519 = append(ks.ed25519, k)
		natural = "EdDSA"
	default:
		return fmt.Errorf("server: auth: PublicKeyPEM block %d: unsupported key type %T", n, pub)
	}
	if !slices.Contains(ks.natural, natural) {
		ks.natural = append(ks.natural, natural)
	}
	return nil
}
