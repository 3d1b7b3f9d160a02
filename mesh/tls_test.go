package mesh_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/mesh"
)

// certs writes a CA and, signed by it, a certificate and key for name, into
// dir; it returns the CA's file and the pair's.
type certs struct{ dir string }

func (c certs) ca(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key, c.write(t, name+".pem", "CERTIFICATE", der)
}

func (c certs) leaf(t *testing.T, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, serial int64) (string, string) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return c.write(t, name+".pem", "CERTIFICATE", der), c.write(t, name+".key", "EC PRIVATE KEY", kb)
}

func (c certs) write(t *testing.T, name, typ string, der []byte) string {
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConnectTLS: a server that requires client certificates takes a host
// with the configured CA and certificate, and refuses one without.
func TestConnectTLS(t *testing.T) {
	c := certs{t.TempDir()}
	ca, caKey, caFile := c.ca(t, "ca")
	srvCert, srvKey := c.leaf(t, "server", ca, caKey, 2)
	hostCert, hostKey := c.leaf(t, "host", ca, caKey, 3)
	_, _, otherCA := c.ca(t, "other-ca")
	srv := startServer(t, fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }", srvCert, srvKey, caFile))
	url := strings.Replace(srv.URL, "nats://", "tls://", 1)

	cfg := meshConfig(url, "a")
	cfg.CAFile, cfg.CertFile, cfg.KeyFile = caFile, hostCert, hostKey
	nc, err := mesh.Connect(cfg)
	if err != nil {
		t.Fatalf("with the CA and a client certificate: %v", err)
	}
	if !nc.TLSRequired() {
		t.Fatal("connected without TLS")
	}
	nc.Close()

	cfg.CertFile, cfg.KeyFile = "", ""
	if _, err := mesh.Connect(cfg); !errors.Is(err, mesh.ErrRefused) || !strings.Contains(err.Error(), "no client certificate") {
		t.Fatalf("without the client certificate the server requires: err = %v, want ErrRefused saying so", err)
	}
	cfg.CAFile, cfg.CertFile, cfg.KeyFile = otherCA, hostCert, hostKey
	if _, err := mesh.Connect(cfg); !errors.Is(err, mesh.ErrRefused) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("server certificate from another CA: err = %v, want ErrRefused about the certificate", err)
	}
}
