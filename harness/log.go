package harness

import (
	"io"
	"log/slog"
	"os"
)

// NewLogger returns the harness's logger on w: format "json" or text, at level,
// with every record keyed by the cluster, generation and pid it comes from.
func NewLogger(w io.Writer, format string, level slog.Level, env Env) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(h).With("cluster", env.Cluster, "generation", env.Generation, "pid", os.Getpid())
}
