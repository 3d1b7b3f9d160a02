package mesh

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sm-supervisor/sm/config"
)

// ErrRefused is matched (errors.Is) by Connect's error when the server
// refused this host's credentials or certificate: a configuration error,
// which a manager reports at start instead of joining.
var ErrRefused = errors.New("the NATS server refused this host")

// maxSecret bounds a token or password file: far above any real secret, far
// below what a wrongly named file would hold.
const maxSecret = 4096

// Connect dials the mesh's NATS server with the configured credentials and
// TLS, and waits for the first connection: an unreachable server, refused
// credentials (ErrRefused) or a bad credentials file is an error naming its
// cause and never a secret. After that, the connection reconnects by itself
// for as long as it is open. Publishes are never buffered while it is down:
// a lease write the server stores seconds after it was sent would outlive
// the holder's fence (Timing), so a write without a connection fails at once.
// extra options come last (tests use them for a custom dialer).
func Connect(cfg config.Mesh, extra ...nats.Option) (*nats.Conn, error) {
	t := TimingFor(cfg.Lease.Duration)
	opts := []nats.Option{
		nats.Name("sm-manager " + cfg.HostID),
		nats.Timeout(t.Renew),
		nats.ReconnectBufSize(-1),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(t.Renew / 4),
		nats.PingInterval(t.Renew),
		nats.MaxPingsOutstanding(2),
	}
	what := "no credentials"
	switch {
	case cfg.CredsFile != "":
		if _, err := os.Stat(cfg.CredsFile); err != nil {
			return nil, fmt.Errorf("mesh.creds_file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
		what = "mesh.creds_file"
	case cfg.TokenFile != "":
		tok, err := readSecret(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("mesh.token_file %s: %w", cfg.TokenFile, err)
		}
		opts = append(opts, nats.Token(tok))
		what = "mesh.token_file"
	case cfg.User != "":
		pw, err := readSecret(cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("mesh.password_file %s: %w", cfg.PasswordFile, err)
		}
		opts = append(opts, nats.UserInfo(cfg.User, pw))
		what = "mesh.user " + cfg.User
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
		what += ", mesh.ca_file"
	}
	if cfg.CertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
		what += ", mesh.cert_file"
	} else {
		what += ", no client certificate"
	}
	nc, err := nats.Connect(cfg.NATSURL, append(opts, extra...)...)
	if err != nil {
		if refused(err) {
			return nil, fmt.Errorf("mesh: %w (%s): %v", ErrRefused, what, err)
		}
		return nil, fmt.Errorf("mesh: connecting to NATS at %s: %w", cfg.NATSURL, err)
	}
	return nc, nil
}

// refused reports whether err is the server saying no to who we are, rather
// than the network failing.
func refused(err error) bool {
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) {
		return true
	}
	s := strings.ToLower(err.Error())
	// Under TLS 1.3 a server rejects a client certificate after the
	// handshake, so the client may see its alert or only the closed
	// connection, which nats.go then names so.
	return strings.Contains(s, "authorization violation") || strings.Contains(s, "authentication") ||
		strings.Contains(s, "certificate") || strings.Contains(s, "closed by remote after tls handshake")
}

// readSecret reads a token or password file: a regular file with no
// permission bits for group or others, like any credential here.
func readSecret(file string) (string, error) {
	fi, err := os.Stat(file) // before opening: opening a FIFO would block
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("mode %04o lets group or others at it; chmod 600 it", fi.Mode().Perm())
	}
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecret+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxSecret {
		return "", fmt.Errorf("longer than %d bytes", maxSecret)
	}
	s := string(bytes.TrimSpace(b))
	if s == "" {
		return "", errors.New("empty")
	}
	return s, nil
}
