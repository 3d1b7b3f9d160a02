package harness

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sm-supervisor/sm/backoff"
	"github.com/sm-supervisor/sm/ipc"
)

// Mode is what the harness runs: the simulated bot or a wrapped program.
type Mode int

// The harness's modes.
const (
	ModeSimulate Mode = iota // --simulate: the built-in simulated bot
	ModeExec                 // --exec -- CMD ARGS...: bridge a child over JSON lines
)

// String returns the mode's flag name.
func (m Mode) String() string {
	if m == ModeExec {
		return "exec"
	}
	return "simulate"
}

// Config is everything Run needs. ParseArgs fills the flag-driven fields; the
// caller sets the injected ones (Logger, Signals, Stderr).
type Config struct {
	Env  Env
	Mode Mode
	// Command is the child program and its arguments (ModeExec).
	Command []string
	// Sim shapes the simulated bot (ModeSimulate).
	Sim SimOptions

	// ExitOnStart, if set, makes Run return at once with an ExitError of that
	// code, before connecting: a crash loop on demand.
	ExitOnStart *int
	// ShutdownTimeout bounds a shutdown asked for by a signal: the simulated bot's
	// drain of in-flight work, or the wait for a child before it is killed.
	ShutdownTimeout time.Duration
	// MaxFrameBytes is the frame limit on the socket and on the child's lines;
	// it must match the manager's max_frame_bytes.
	MaxFrameBytes int
	// LogFormat ("text" or "json") and LogLevel are for NewLogger.
	LogFormat string
	LogLevel  slog.Level

	// Logger receives the harness's logs; nil discards them.
	Logger *slog.Logger
	// Signals delivers SIGTERM and SIGINT: a simulated bot quiesces and exits,
	// an exec child gets them forwarded. Nil means none arrive.
	Signals <-chan os.Signal
	// Stderr receives an exec child's stderr; nil means os.Stderr.
	Stderr io.Writer
	// Now is the clock of uptimes and timers' bookkeeping; nil means time.Now.
	Now func() time.Time
	// Backoff paces reconnection to the manager; zero means ipc's default.
	Backoff backoff.Policy

	// onClient is told of the connection to the manager once it is made
	// (Run watches it for an orphan).
	onClient func(*ipc.Client)
}

// SimOptions shape the simulated bot and its injected failures.
type SimOptions struct {
	// HeartbeatInterval is used until the REGISTER reply names one.
	HeartbeatInterval time.Duration
	// ConnectDelay is how long each shard takes to connect, one after another.
	ConnectDelay time.Duration
	// EventInterval is the pace of simulated gateway dispatches; 0 turns them off.
	EventInterval time.Duration
	// EventBuffer bounds the dispatches held before ACTIVATE; past it the oldest
	// are dropped (and counted).
	EventBuffer int
	// OpDelay is how long each business op takes to handle.
	OpDelay time.Duration
	// IdentifyTimeout bounds each wait for the manager's identify gate; past
	// it the shard asks again.
	IdentifyTimeout time.Duration
	// IdentifyRetry is how long a shard waits before asking the gate again
	// after a refusal (budget_refused, forbidden) or a failed ask.
	IdentifyRetry time.Duration

	// FailReady leaves the last shard connecting forever: never ready.
	FailReady bool
	// CrashAfter, if positive, makes Run return ExitError{Code: 3} after it.
	CrashAfter time.Duration
	// HangAfter, if positive, stops heartbeats and all answers after it; the
	// process stays alive.
	HangAfter time.Duration
	// IgnoreQuiesce ignores QUIESCE, SIGTERM and SIGINT: only SIGKILL ends it.
	IgnoreQuiesce bool

	// Record, if set, is a file the bot appends a line to when it is
	// activated and when it exits (package internal/activations), so that a
	// test can check that no two processes of a cluster were ever activated
	// at once, on one host or several sharing the file.
	Record string
}

// CrashExitCode is the exit code of --crash-after.
const CrashExitCode = 3

// simOnlyFlags may not be combined with --exec.
var simOnlyFlags = []string{
	"heartbeat-interval", "connect-delay", "event-interval", "event-buffer", "op-delay",
	"identify-timeout", "identify-retry", "fail-ready", "crash-after", "hang-after", "ignore-quiesce", "record",
}

// ParseArgs parses the command line (args without the program name), then the
// extra flags of SM_HARNESS_FLAGS and SM_HARNESS_FLAGS_<cluster>, and the SM_*
// environment, all through getenv. Usage and flag errors go to usage. It returns
// flag.ErrHelp for -h.
func ParseArgs(name string, args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	// Reconnect quickly: after a manager restart the new manager re-adopts
	// only the clusters that come back within its adopt window.
	cfg := Config{Backoff: backoff.Policy{Min: 50 * time.Millisecond, Max: time.Second, Jitter: 0.2}}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Usage = func() {
		fmt.Fprintf(usage, "usage: %s [--simulate] [flags]\n       %s --exec [flags] -- CMD [ARGS...]\n\n", name, name)
		fmt.Fprintf(usage, "Extra flags may also come from $%s and $%s_<cluster>.\n\nflags:\n", EnvFlags, EnvFlags)
		fs.PrintDefaults()
	}
	fs.Bool("simulate", true, "run the built-in simulated bot")
	execMode := fs.Bool("exec", false, "run the command after -- as the bot, bridged over JSON lines on its stdin/stdout")
	fs.DurationVar(&cfg.Sim.HeartbeatInterval, "heartbeat-interval", time.Second, "heartbeat interval until the REGISTER reply names one")
	fs.DurationVar(&cfg.Sim.ConnectDelay, "connect-delay", 100*time.Millisecond, "time each shard takes to connect, one after another")
	fs.DurationVar(&cfg.Sim.EventInterval, "event-interval", 200*time.Millisecond, "interval of simulated gateway dispatches (0 = none)")
	fs.IntVar(&cfg.Sim.EventBuffer, "event-buffer", 10000, "dispatches buffered before ACTIVATE; older ones are dropped past it")
	fs.DurationVar(&cfg.Sim.OpDelay, "op-delay", 0, "time each business op takes to handle")
	fs.DurationVar(&cfg.Sim.IdentifyTimeout, "identify-timeout", 10*time.Minute, "longest wait for the manager's identify gate before asking again")
	fs.DurationVar(&cfg.Sim.IdentifyRetry, "identify-retry", 5*time.Second, "wait before asking the identify gate again after a refusal or a failed ask")
	fs.BoolVar(&cfg.Sim.FailReady, "fail-ready", false, "failure: never become ready (the last shard never connects)")
	fs.DurationVar(&cfg.Sim.CrashAfter, "crash-after", 0, fmt.Sprintf("failure: exit with code %d after this long (0 = never)", CrashExitCode))
	fs.DurationVar(&cfg.Sim.HangAfter, "hang-after", 0, "failure: stop heartbeating and answering after this long, but stay alive (0 = never)")
	fs.BoolVar(&cfg.Sim.IgnoreQuiesce, "ignore-quiesce", false, "failure: ignore QUIESCE, SIGTERM and SIGINT (only SIGKILL ends it)")
	fs.StringVar(&cfg.Sim.Record, "record", "", "append a JSON line to this `file` at activation and at exit (tests: never two processes of a cluster activated at once)")
	exitOnStart := fs.Int("exit-on-start", -1, "failure: exit at once with this code (-1 = off)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 5*time.Second, "bound on the shutdown a SIGTERM or SIGINT starts")
	fs.IntVar(&cfg.MaxFrameBytes, "max-frame-bytes", ipc.DefaultOptions.MaxFrameBytes, "largest frame, as the manager's max_frame_bytes")
	fs.StringVar(&cfg.LogFormat, "log-format", "text", "log `format` on stderr: text or json")
	fs.TextVar(&cfg.LogLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn or error")

	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	cfg.Command = fs.Args()
	env, err := ParseEnv(getenv)
	if err != nil {
		return Config{}, err
	}
	cfg.Env = env
	if extra := extraArgs(getenv, env.Cluster); len(extra) > 0 {
		if err := fs.Parse(extra); err != nil {
			return Config{}, fmt.Errorf("$%s: %w", EnvFlags, err)
		}
		if fs.NArg() > 0 {
			return Config{}, fmt.Errorf("$%s: unexpected argument %q", EnvFlags, fs.Arg(0))
		}
	}
	if *execMode {
		cfg.Mode = ModeExec
	}
	if *exitOnStart != -1 {
		cfg.ExitOnStart = exitOnStart
	}
	if err := cfg.validate(setFlags(fs)); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

func setFlags(fs *flag.FlagSet) map[string]bool {
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// validate checks the flags against each other; set names the flags given.
func (c *Config) validate(set map[string]bool) error {
	var errs []error
	switch c.Mode {
	case ModeExec:
		if len(c.Command) == 0 {
			errs = append(errs, errors.New("--exec needs a command after --"))
		}
		for _, name := range simOnlyFlags {
			if set[name] {
				errs = append(errs, fmt.Errorf("--%s is for the simulated bot, not --exec", name))
			}
		}
	case ModeSimulate:
		if len(c.Command) > 0 {
			errs = append(errs, fmt.Errorf("unexpected argument %q (did you mean --exec -- %s?)", c.Command[0], strings.Join(c.Command, " ")))
		}
	}
	type durationFlag struct {
		name string
		d    time.Duration
	}
	for _, f := range []durationFlag{
		{"heartbeat-interval", c.Sim.HeartbeatInterval},
		{"identify-timeout", c.Sim.IdentifyTimeout},
		{"identify-retry", c.Sim.IdentifyRetry},
		{"shutdown-timeout", c.ShutdownTimeout},
	} {
		if f.d <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be positive, got %v", f.name, f.d))
		}
	}
	for _, f := range []durationFlag{
		{"connect-delay", c.Sim.ConnectDelay},
		{"event-interval", c.Sim.EventInterval},
		{"op-delay", c.Sim.OpDelay},
		{"crash-after", c.Sim.CrashAfter},
		{"hang-after", c.Sim.HangAfter},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("--%s must not be negative, got %v", f.name, f.d))
		}
	}
	if c.Sim.EventBuffer < 0 {
		errs = append(errs, fmt.Errorf("--event-buffer must not be negative, got %d", c.Sim.EventBuffer))
	}
	if c.ExitOnStart != nil && (*c.ExitOnStart < 0 || *c.ExitOnStart > 255) {
		errs = append(errs, fmt.Errorf("--exit-on-start must be -1 (off) or an exit code 0..255, got %d", *c.ExitOnStart))
	}
	if c.MaxFrameBytes < 1024 {
		errs = append(errs, fmt.Errorf("--max-frame-bytes must be at least 1024, got %d", c.MaxFrameBytes))
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format must be text or json, got %q", c.LogFormat))
	}
	return errors.Join(errs...)
}
