package discord

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// ErrTokenFileMode is matched (errors.Is) by LoadToken's error for a token file
// that group or others may read or write.
var ErrTokenFileMode = errors.New("token file is accessible by group or others")

// maxTokenLen is far above a real token (about 72 bytes) and far below what a
// wrongly named file (a log, a binary) would hold.
const maxTokenLen = 512

// LoadToken reads the bot token from file or, when file is "", from the
// environment variable env. A named file is the only source: if it is missing,
// unreadable, empty or too open, that is the error, with no fallback to env, so
// a typo in the path never starts the bot with some other token.
//
// The file must be a regular file (symlinks are followed, as for Kubernetes
// secrets) with no permission bits for group or others (mode & 0o077 == 0,
// like ssh's private keys): it is a credential to the whole bot. A more open
// file is refused (ErrTokenFileMode) rather than warned about, since a warning
// in a log nobody reads protects nothing; where the platform mounts secrets
// 0444 or 0644, use env or copy the file with `install -m 600`.
//
// Surrounding white space and a leading "Bot " are removed. A token that is
// empty, longer than 512 bytes, or holds anything but printable ASCII is
// refused. No error ever contains the token or any part of the file.
func LoadToken(file, env string) (string, error) {
	switch {
	case file != "":
		return tokenFromFile(file)
	case env != "":
		v, ok := os.LookupEnv(env)
		if !ok || strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("discord token: environment variable %s is unset or empty", env)
		}
		tok, err := cleanToken(v)
		if err != nil {
			return "", fmt.Errorf("discord token from environment variable %s: %w", env, err)
		}
		return tok, nil
	default:
		return "", fmt.Errorf("discord token: %w (name a token file or an environment variable)", ErrNoToken)
	}
}

func tokenFromFile(file string) (string, error) {
	fail := func(err error) (string, error) { return "", fmt.Errorf("discord token file %s: %w", file, err) }
	// Stat before opening: opening a FIFO would block.
	fi, err := os.Stat(file)
	if err != nil {
		return fail(err)
	}
	if err := checkTokenFile(fi); err != nil {
		return fail(err)
	}
	f, err := os.Open(file)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	// Again on the open file: it may have been replaced since the Stat.
	if fi, err = f.Stat(); err != nil {
		return fail(err)
	}
	if err := checkTokenFile(fi); err != nil {
		return fail(err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4*maxTokenLen))
	if err != nil {
		return fail(err)
	}
	tok, err := cleanToken(string(b))
	if err != nil {
		return fail(err)
	}
	return tok, nil
}

func checkTokenFile(fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%w (mode %#o): chmod 600 it, or pass the token in an environment variable", ErrTokenFileMode, perm)
	}
	return nil
}

// cleanToken trims s, drops a "Bot " prefix and checks what is left.
func cleanToken(s string) (string, error) {
	s = strings.TrimSpace(s)
	if len(s) >= 4 && strings.EqualFold(s[:4], "bot ") {
		s = strings.TrimSpace(s[4:])
	}
	if err := checkToken(s); err != nil {
		return "", err
	}
	return s, nil
}

// checkToken refuses what cannot be a token. Its errors never quote s.
func checkToken(s string) error {
	switch {
	case s == "":
		return errors.New("token is empty")
	case len(s) > maxTokenLen:
		return fmt.Errorf("token is %d bytes, longer than any Discord token", len(s))
	case strings.IndexFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		// Discord tokens are printable ASCII; this also keeps a stray newline
		// or a second line of the file out of the Authorization header.
		return errors.New("token holds white space, control or non-ASCII characters (one token, nothing else, is expected)")
	}
	return nil
}
