package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/sm-supervisor/sm/config"
)

// MinTokenBytes is the shortest API token sm-api accepts: the token lets its
// holder deploy and drive the bot, so it must not be guessable.
const MinTokenBytes = 16

// ErrNoToken is wrapped by LoadToken when no usable token is configured.
var ErrNoToken = errors.New("no API token")

// LoadToken reads the bearer token the /v1 endpoints require: from
// api.token_file if it is set (surrounding whitespace trimmed), else from the
// environment variable api.token_env (looked up with getenv). It refuses an
// empty token, a short one, and one a header cannot carry.
func LoadToken(cfg config.API, getenv func(string) string, log *slog.Logger) (string, error) {
	var tok, from string
	switch {
	case cfg.TokenFile != "":
		from = "api.token_file " + cfg.TokenFile
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoToken, err)
		}
		if fi, err := os.Stat(cfg.TokenFile); err == nil && fi.Mode().Perm()&0o007 != 0 && log != nil {
			log.Warn("API token file (api.token_file) is readable by other users", "mode", fi.Mode().Perm().String())
		}
		tok = strings.TrimSpace(string(b))
	case cfg.TokenEnv != "":
		from = "environment variable " + cfg.TokenEnv + " (api.token_env)"
		tok = strings.TrimSpace(getenv(cfg.TokenEnv))
	default:
		return "", fmt.Errorf("%w: set api.token_file or api.token_env", ErrNoToken)
	}
	switch {
	case tok == "":
		return "", fmt.Errorf("%w: %s is empty; sm-api does not serve without one (make one with: openssl rand -hex 32)", ErrNoToken, from)
	case len(tok) < MinTokenBytes:
		return "", fmt.Errorf("%w: the token in %s is %d bytes; use at least %d (openssl rand -hex 32)", ErrNoToken, from, len(tok), MinTokenBytes)
	case strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "", fmt.Errorf("%w: the token in %s holds spaces or control characters", ErrNoToken, from)
	}
	return tok, nil
}

// authenticator checks the bearer token of /v1 requests. It compares SHA-256
// digests in constant time, so neither the token's bytes nor its length leak
// through timing.
type authenticator struct {
	digest [sha256.Size]byte
}

func newAuthenticator(token string) *authenticator {
	return &authenticator{digest: sha256.Sum256([]byte(token))}
}

// check returns nil if r carries the token, else the 401 to send. The scheme
// is case-insensitive, as RFC 7235 has it.
func (a *authenticator) check(w http.ResponseWriter, r *http.Request) *Error {
	h := r.Header.Get("Authorization")
	if h == "" {
		return errorf(http.StatusUnauthorized, CodeUnauthorized, "missing Authorization: Bearer <token>")
	}
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sm-api", error="invalid_request"`)
		return errorf(http.StatusUnauthorized, CodeUnauthorized, "the Authorization scheme must be Bearer")
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(cred)))
	if subtle.ConstantTimeCompare(got[:], a.digest[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sm-api", error="invalid_token"`)
		return errorf(http.StatusUnauthorized, CodeUnauthorized, "invalid token")
	}
	return nil
}

// require wraps h so that it runs only for requests with the token.
func (a *authenticator) require(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := a.check(w, r); e != nil {
			writeError(w, e)
			return
		}
		h.ServeHTTP(w, r)
	})
}
