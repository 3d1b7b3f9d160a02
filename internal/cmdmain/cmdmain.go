// Package cmdmain is what sm's commands share in their main: running the
// command and reporting its error, and the daemons' logger.
package cmdmain

import (
	"fmt"
	"log/slog"
	"os"
)

// Main runs run and, if it fails, prints the error after the command's name
// on stderr and exits 1: a command's main is this one call.
func Main(name string, run func() error) {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Logger logs to stderr at level (a slog level name, as config's log_level;
// info if it names none), as JSON lines if asJSON, else as text.
func Logger(level string, asJSON bool) *slog.Logger {
	var lv slog.Level
	lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if asJSON {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
