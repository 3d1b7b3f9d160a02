// Package config loads sm's TOML configuration: one struct, defaults filled in
// one function, validated in one function, unknown keys refused.
package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
)

// Config is the whole of sm-manager's configuration. Every key is documented,
// with its default, in config.example.toml.
type Config struct {
	Socket      string   `toml:"socket"`
	SocketMode  FileMode `toml:"socket_mode"`
	AllowedUIDs []int    `toml:"allowed_uids"`
	LogLevel    string   `toml:"log_level"`

	Topology  Topology  `toml:"topology"`
	Cluster   Cluster   `toml:"cluster"`
	Heartbeat Heartbeat `toml:"heartbeat"`
	Restart   Restart   `toml:"restart"`
	Requests  Requests  `toml:"requests"`
	Limits    Limits    `toml:"limits"`
	Shutdown  Shutdown  `toml:"shutdown"`
	Deploy    Deploy    `toml:"deploy"`
	Status    Status    `toml:"status"`
	Admin     Admin     `toml:"admin"`
	API       API       `toml:"api"`
	State     State     `toml:"state"`
	Discord   Discord   `toml:"discord"`
	Mesh      Mesh      `toml:"mesh"`
	Reshard   Reshard   `toml:"reshard"`
	Recycle   Recycle   `toml:"recycle"`

	// Path is the file the config was loaded from, for re-reading at DEPLOY.
	Path string `toml:"-"`
}

// Topology is the [topology] table.
type Topology struct {
	TotalShards      int `toml:"total_shards"`
	ShardsPerCluster int `toml:"shards_per_cluster"`
	// Auto is set by total_shards = "auto": TotalShards then comes from
	// Discord's GET /gateway/bot (see ResolveAuto) and is 0 until it does.
	Auto bool `toml:"-"`
}

// UnmarshalTOML decodes the table by hand so total_shards may be a number or
// the string "auto".
func (t *Topology) UnmarshalTOML(v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("topology must be a table")
	}
	for k, val := range m {
		switch k {
		case "total_shards":
			switch n := val.(type) {
			case int64:
				t.TotalShards, t.Auto = int(n), false
			case string:
				if n != "auto" {
					return keyError{"topology.total_shards", fmt.Sprintf(`%q is neither a number nor "auto"`, n)}
				}
				t.TotalShards, t.Auto = 0, true
			default:
				return keyError{"topology.total_shards", fmt.Sprintf(`must be a number or "auto", got %T`, val)}
			}
		case "shards_per_cluster":
			n, ok := val.(int64)
			if !ok {
				return keyError{"topology.shards_per_cluster", fmt.Sprintf("must be a number, got %T", val)}
			}
			t.ShardsPerCluster = int(n)
		default:
			return keyError{"topology." + k, "unknown key"}
		}
	}
	return nil
}

// MarshalTOML writes the table back, "auto" included.
func (t Topology) MarshalTOML() ([]byte, error) {
	total := strconv.Itoa(t.TotalShards)
	if t.Auto {
		total = `"auto"`
	}
	return []byte(fmt.Sprintf("{ total_shards = %s, shards_per_cluster = %d }", total, t.ShardsPerCluster)), nil
}

// Generation returns the topology in the generation package's terms.
func (t Topology) Generation() generation.Topology {
	return generation.Topology{Total: t.TotalShards, PerCluster: t.ShardsPerCluster}
}

// Cluster is the [cluster] table: how a cluster process is started.
type Cluster struct {
	Command []string          `toml:"command"`
	Env     map[string]string `toml:"env"`
	Dir     string            `toml:"dir"`
}

// Heartbeat is the [heartbeat] table.
type Heartbeat struct {
	Interval     Duration `toml:"interval"`
	Timeout      Duration `toml:"timeout"`
	StartTimeout Duration `toml:"start_timeout"`
}

// Restart is the [restart] table: backoff between respawns and the restart
// intensity past which a cluster is in a crash loop.
type Restart struct {
	BackoffMin Duration `toml:"backoff_min"`
	BackoffMax Duration `toml:"backoff_max"`
	Jitter     float64  `toml:"jitter"`
	Intensity  int      `toml:"intensity"`
	Period     Duration `toml:"period"`
	StopGrace  Duration `toml:"stop_grace"`
}

// Requests is the [requests] table.
type Requests struct {
	Timeout Duration `toml:"timeout"`
}

// Limits is the [limits] table: every bound on what a peer can make the manager hold.
type Limits struct {
	MaxFrameBytes   int      `toml:"max_frame_bytes"`
	MaxQueue        int      `toml:"max_queue"`
	MaxQueueBytes   int      `toml:"max_queue_bytes"`
	MaxPending      int      `toml:"max_pending"`
	MaxWaiting      int      `toml:"max_waiting"`
	MaxConnections  int      `toml:"max_connections"`
	MaxSubscribers  int      `toml:"max_subscribers"`
	FeedBuffer      int      `toml:"feed_buffer"`
	MaxJSONDepth    int      `toml:"max_json_depth"`
	WriteTimeout    Duration `toml:"write_timeout"`
	RegisterTimeout Duration `toml:"register_timeout"`
	// MaxHandoffBytes bounds the handoff a QUIESCED may leave for the
	// cluster's next ACTIVATE; a larger one is ignored.
	MaxHandoffBytes int `toml:"max_handoff_bytes"`
}

// Shutdown is the [shutdown] table.
type Shutdown struct {
	Timeout Duration `toml:"timeout"`
}

// Deploy is the [deploy] table.
type Deploy struct {
	ReadyTimeout   Duration `toml:"ready_timeout"`
	QuiesceTimeout Duration `toml:"quiesce_timeout"`
}

// Recycle is the [recycle] table: replacing a cluster whose memory or
// event-loop lag stayed above a limit for a while with a fresh process of
// the same generation, through the deploy's handoff (docs/deploys.md#recycling).
type Recycle struct {
	Enabled bool `toml:"enabled"`
	// MaxRSS is in bytes: the resident memory of the cluster's process and
	// of the processes of its process group, read from /proc. 0: not watched.
	MaxRSS int64 `toml:"max_rss"`
	// MaxHeap is in bytes, from the heartbeat payload's heap_bytes. 0: not watched.
	MaxHeap int64 `toml:"max_heap"`
	// MaxLag is from the heartbeat payload's loop_lag_ms. 0: not watched.
	MaxLag      Duration `toml:"max_lag"`
	Sustain     Duration `toml:"sustain"`
	Interval    Duration `toml:"interval"`
	MaxParallel int      `toml:"max_parallel"`
	Cooldown    Duration `toml:"cooldown"`
	// Mode is how the fresh process takes over: "overlap" (beside the old
	// one, zero gap, its shards identify) or "resume" (after the old one,
	// resuming its sessions: no identify, a short gap), as DEPLOY's mode.
	Mode string `toml:"mode"`
}

// Status is the [status] table: the public, read-only status page and WebSocket.
type Status struct {
	// Listen is the TCP address of the page and feed; empty disables them.
	Listen string `toml:"listen"`
	// AllowedOrigins are the Origin host patterns (path.Match syntax) a browser
	// may open the WebSocket from, besides the page's own host.
	AllowedOrigins []string `toml:"allowed_origins"`
}

// Discord is the [discord] table: the bot token for Discord's HTTP API (only
// for total_shards = "auto" and the session-start budget), the identify gate
// and resume handling.
type Discord struct {
	TokenFile  string `toml:"token_file"`
	TokenEnv   string `toml:"token_env"`
	APIBaseURL string `toml:"api_base_url"`
	// IdentifySpacing is the time between two IDENTIFYs of one rate-limit
	// bucket: Discord's 5s plus a margin for the jitter between a grant and
	// the IDENTIFY on the wire (docs/discord.md). MaxConcurrency overrides the bucket count
	// /gateway/bot gives (0: use it; 1 without a token).
	IdentifySpacing Duration `toml:"identify_spacing"`
	IdentifyTimeout Duration `toml:"identify_timeout"`
	MaxConcurrency  int      `toml:"max_concurrency"`
	// BudgetFloor: at or below this many remaining session starts,
	// crash-looping clusters are not granted identifies.
	BudgetFloor  int      `toml:"budget_floor"`
	ResumeMaxAge Duration `toml:"resume_max_age"`
}

// HasToken reports whether a Discord bot token is configured.
func (d Discord) HasToken() bool { return d.TokenFile != "" || d.TokenEnv != "" }

// State is the [state] table: what lets clusters outlive a manager restart.
type State struct {
	// Dir holds the state file (which processes run which clusters). Empty
	// means $STATE_DIRECTORY when systemd sets it (StateDirectory=), else no
	// state file: a restarted manager then starts every cluster anew.
	Dir string `toml:"dir"`
	// AdoptWindow is how long a restarted manager waits for surviving
	// clusters to reconnect before it replaces the ones that did not.
	AdoptWindow Duration `toml:"adopt_window"`
}

// Admin is the [admin] table: the manager's Prometheus metrics endpoint.
type Admin struct {
	// Listen is the TCP address of /metrics; empty disables it.
	Listen string `toml:"listen"`
}

// API is the [api] table, read by sm-api (sm-manager ignores it).
type API struct {
	Listen         string   `toml:"listen"`
	TokenFile      string   `toml:"token_file"`
	TokenEnv       string   `toml:"token_env"`
	MaxBodyBytes   int64    `toml:"max_body_bytes"`
	ReadTimeout    Duration `toml:"read_timeout"`
	WriteTimeout   Duration `toml:"write_timeout"`
	IdleTimeout    Duration `toml:"idle_timeout"`
	RequestTimeout Duration `toml:"request_timeout"`
	// StatsMaxFields bounds the heartbeat fields GET /v1/stats aggregates:
	// the first this many numeric top-level fields, by name, of all clusters.
	StatsMaxFields int `toml:"stats_max_fields"`
}

// Mesh is the [mesh] table: many hosts sharing one bot's clusters through a
// NATS JetStream server (docs/multihost.md). An empty NATSURL, the default,
// is a single host, and no other key of the table is then used.
type Mesh struct {
	// NATSURL is the NATS server, or a comma-separated list of servers of
	// one NATS cluster ("nats://nats-1:4222,nats://nats-2:4222").
	NATSURL string `toml:"nats_url"`
	// Name is the mesh's name: hosts with the same name share its clusters.
	// The JetStream buckets are named after it, so two bots can share a
	// NATS server.
	Name string `toml:"name"`
	// HostID names this machine in the mesh; it must stay the same across
	// restarts and differ from every other host's.
	HostID string `toml:"host_id"`
	// MaxClusters is this host's capacity; 0 is no limit.
	MaxClusters int `toml:"max_clusters"`
	// Lease is how long a cluster's ownership and a host's record last
	// without renewal. The renewal interval and the fencing margin derive
	// from it (mesh.TimingFor). Every host of a mesh must use the same.
	Lease Duration `toml:"lease"`
	// Replicas is how many servers of a JetStream cluster keep each of the
	// mesh's buckets: 3 on a 3-node NATS cluster survives losing one node.
	// Used by the first host that makes the buckets.
	Replicas int `toml:"replicas"`
	// MaxForwards bounds the requests this host has forwarded to clusters
	// on other hosts and awaits the replies of; a request over it is
	// answered unavailable.
	MaxForwards int `toml:"max_forwards"`

	// At most one of these authenticates to NATS: a credentials file (JWT
	// and NKey seed), a file holding a token, or a user with a file holding
	// the password.
	CredsFile    string `toml:"creds_file"`
	TokenFile    string `toml:"token_file"`
	User         string `toml:"user"`
	PasswordFile string `toml:"password_file"`

	// CAFile verifies the server's certificate (and implies TLS); CertFile
	// and KeyFile, set together, are this host's client certificate.
	CAFile   string `toml:"ca_file"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
}

// Enabled reports whether the manager joins a mesh.
func (m Mesh) Enabled() bool { return m.NATSURL != "" }

// meshName is what a mesh name and a host id may hold: the characters of a
// JetStream bucket name and of one token of a NATS subject.
var meshName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Duration is a time.Duration written as a Go duration string ("1.5s").
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalText renders the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// FileMode is a permission mode written as an octal string ("0660").
type FileMode uint32

// UnmarshalTOML takes the mode only as a string. A TOML integer is refused: by
// the time it gets here 0o660 and 432 are the same number, and a mode written as
// decimal 660 or octal 0o660 would silently be some other mode.
func (m *FileMode) UnmarshalTOML(v any) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("write the mode as an octal string such as \"0660\" (a TOML number is ambiguous), got %v", v)
	}
	return m.UnmarshalText([]byte(s))
}

// UnmarshalText parses an octal mode.
func (m *FileMode) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 8, 32)
	if err != nil || v > 0o777 {
		return fmt.Errorf("%q is not an octal permission mode", b)
	}
	*m = FileMode(v)
	return nil
}

// MarshalText renders the mode in octal.
func (m FileMode) MarshalText() ([]byte, error) { return []byte(fmt.Sprintf("%04o", uint32(m))), nil }

// Default returns the configuration used for every key a file leaves out.
func Default() Config {
	return Config{
		Socket:     "/run/sm/sm.sock",
		SocketMode: 0o660,
		LogLevel:   "info",
		Topology:   Topology{TotalShards: 16, ShardsPerCluster: 4},
		Cluster:    Cluster{Command: []string{"cluster-harness", "--simulate"}},
		Heartbeat: Heartbeat{
			Interval:     Duration{time.Second},
			Timeout:      Duration{5 * time.Second},
			StartTimeout: Duration{30 * time.Second},
		},
		Restart: Restart{
			BackoffMin: Duration{500 * time.Millisecond},
			BackoffMax: Duration{30 * time.Second},
			Jitter:     0.2,
			Intensity:  5,
			Period:     Duration{time.Minute},
			StopGrace:  Duration{5 * time.Second},
		},
		Requests: Requests{Timeout: Duration{10 * time.Second}},
		Limits: Limits{
			MaxFrameBytes:   1 << 20,
			MaxQueue:        4096,
			MaxQueueBytes:   64 << 20,
			MaxPending:      65536,
			MaxWaiting:      1024,
			MaxConnections:  1024,
			MaxSubscribers:  1024,
			FeedBuffer:      256,
			MaxJSONDepth:    ipc.MaxDepthLimit,
			WriteTimeout:    Duration{10 * time.Second},
			RegisterTimeout: Duration{5 * time.Second},
			MaxHandoffBytes: 64 << 10,
		},
		Shutdown: Shutdown{Timeout: Duration{30 * time.Second}},
		Deploy: Deploy{
			ReadyTimeout:   Duration{2 * time.Minute},
			QuiesceTimeout: Duration{30 * time.Second},
		},
		Status: Status{Listen: "127.0.0.1:7480"},
		Recycle: Recycle{
			Sustain:     Duration{time.Minute},
			Interval:    Duration{10 * time.Second},
			MaxParallel: 1,
			Cooldown:    Duration{10 * time.Minute},
			Mode:        "overlap",
		},
		State: State{AdoptWindow: Duration{10 * time.Second}},
		Discord: Discord{
			APIBaseURL:      "https://discord.com/api/v10",
			IdentifySpacing: Duration{discord.DefaultSpacing}, // Discord's 5s + a 500ms margin
			IdentifyTimeout: Duration{10 * time.Minute},
			BudgetFloor:     100,
			ResumeMaxAge:    Duration{2 * time.Minute},
		},
		Admin:   Admin{Listen: "127.0.0.1:7481"},
		Mesh:    Mesh{Name: "sm", Lease: Duration{10 * time.Second}, Replicas: 1, MaxForwards: 4096},
		Reshard: defaultReshard(),
		API: API{
			Listen:         "127.0.0.1:7482",
			TokenEnv:       "SM_API_TOKEN",
			MaxBodyBytes:   1 << 20,
			ReadTimeout:    Duration{10 * time.Second},
			WriteTimeout:   Duration{30 * time.Second},
			IdleTimeout:    Duration{2 * time.Minute},
			RequestTimeout: Duration{10 * time.Second},
			StatsMaxFields: 64,
		},
	}
}

// Load reads, decodes and validates the file at path. Keys the file leaves out
// keep their defaults; unknown keys are an error naming them.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg.Path = abs
	return cfg, nil
}

// Parse decodes and validates a configuration document.
func Parse(doc string) (*Config, error) {
	cfg := Default()
	md, err := toml.Decode(doc, &cfg)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			// Topology decodes itself (total_shards may be "auto"); its
			// errors name their key, and the line is the key's own.
			// (The decoder keeps only the message of a custom decoder's error.)
			if key, msg, ok := strings.Cut(perr.Message, ": "); ok && strings.HasPrefix(key, "topology.") {
				return nil, fmt.Errorf("line %d: %s: %s", lineOfKey(doc, key, perr.Position.Line), key, msg)
			}
			// LastKey is set when a value was refused (a bad duration, say):
			// name the key, as every other config error does.
			if perr.LastKey != "" {
				return nil, fmt.Errorf("line %d: %s: %s", perr.Position.Line, perr.LastKey, perr.Message)
			}
			return nil, fmt.Errorf("line %d: %s", perr.Position.Line, perr.Message)
		}
		return nil, err
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("unknown key(s): %s", strings.Join(keys, ", "))
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// keyError is a refused value of a key that a custom decoder checked.
type keyError struct{ key, msg string }

func (e keyError) Error() string { return e.key + ": " + e.msg }

// lineOfKey finds the line that sets key (its last dotted part) at or after
// line from, for errors the decoder can only place at the table's header.
func lineOfKey(doc, key string, from int) int {
	name := key[strings.LastIndexByte(key, '.')+1:]
	for i, line := range strings.Split(doc, "\n") {
		if i+1 < from {
			continue
		}
		if k, _, ok := strings.Cut(strings.TrimSpace(line), "="); ok && strings.TrimSpace(k) == name {
			return i + 1
		}
	}
	return from
}

// reservedEnv are the variables the manager sets in every cluster's environment.
var reservedEnv = map[string]bool{
	"SM_SOCKET": true, "SM_CLUSTER": true, "SM_GENERATION": true, "SM_SHARD_FIRST": true,
	"SM_SHARD_LAST": true, "SM_TOTAL_SHARDS": true, "SM_TOKEN": true, "SM_HOST_ID": true,
	"SM_ORPHAN_TIMEOUT_MS": true,
}

// Validate checks every key's value, naming the key in the error.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	positive := func(key string, d Duration) {
		if d.Duration <= 0 {
			bad(key, "must be a positive duration, got %v", d.Duration)
		}
	}
	atLeast := func(key string, v, least int) {
		if v < least {
			bad(key, "must be at least %d, got %d", least, v)
		}
	}
	if c.Socket == "" {
		bad("socket", "must name a path")
	}
	if len(c.Socket) > 107 {
		bad("socket", "path is %d bytes; a Unix socket path holds at most 107", len(c.Socket))
	}
	if c.SocketMode > 0o777 {
		bad("socket_mode", "%04o is not a permission mode", uint32(c.SocketMode))
	}
	for _, uid := range c.AllowedUIDs {
		if uid < 0 {
			bad("allowed_uids", "uid %d is negative", uid)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	switch {
	case c.Topology.Auto && !c.Discord.HasToken():
		bad("topology.total_shards", `"auto" asks Discord, and needs discord.token_file or discord.token_env`)
	case !c.Topology.Auto && c.Topology.TotalShards < 1:
		bad("topology.total_shards", "must be at least 1, got %d", c.Topology.TotalShards)
	}
	atLeast("topology.shards_per_cluster", c.Topology.ShardsPerCluster, 1)
	if len(c.Cluster.Command) == 0 || c.Cluster.Command[0] == "" {
		bad("cluster.command", "must name a program")
	}
	for k := range c.Cluster.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			bad("cluster.env", "%q is not a variable name", k)
		} else if reservedEnv[k] {
			bad("cluster.env", "%s is set by the manager for each spawn", k)
		}
	}
	positive("heartbeat.interval", c.Heartbeat.Interval)
	positive("heartbeat.timeout", c.Heartbeat.Timeout)
	positive("heartbeat.start_timeout", c.Heartbeat.StartTimeout)
	if c.Heartbeat.Timeout.Duration <= c.Heartbeat.Interval.Duration {
		bad("heartbeat.timeout", "must exceed heartbeat.interval (%v)", c.Heartbeat.Interval.Duration)
	}
	positive("restart.backoff_min", c.Restart.BackoffMin)
	positive("restart.backoff_max", c.Restart.BackoffMax)
	if c.Restart.BackoffMax.Duration < c.Restart.BackoffMin.Duration {
		bad("restart.backoff_max", "must be at least restart.backoff_min (%v)", c.Restart.BackoffMin.Duration)
	}
	if c.Restart.Jitter < 0 || c.Restart.Jitter >= 1 {
		bad("restart.jitter", "must be in [0, 1), got %v", c.Restart.Jitter)
	}
	atLeast("restart.intensity", c.Restart.Intensity, 1)
	positive("restart.period", c.Restart.Period)
	positive("restart.stop_grace", c.Restart.StopGrace)
	positive("requests.timeout", c.Requests.Timeout)
	atLeast("limits.max_frame_bytes", c.Limits.MaxFrameBytes, 1024)
	atLeast("limits.max_queue", c.Limits.MaxQueue, 1)
	atLeast("limits.max_pending", c.Limits.MaxPending, 1)
	atLeast("limits.max_waiting", c.Limits.MaxWaiting, 1)
	atLeast("limits.max_connections", c.Limits.MaxConnections, 1)
	atLeast("limits.max_subscribers", c.Limits.MaxSubscribers, 1)
	atLeast("limits.feed_buffer", c.Limits.FeedBuffer, 1)
	atLeast("limits.max_handoff_bytes", c.Limits.MaxHandoffBytes, 1)
	// Above ipc.MaxDepthLimit encoding/json refuses the frame anyway; a frame
	// with an object payload needs 2.
	if d := c.Limits.MaxJSONDepth; d < 2 || d > ipc.MaxDepthLimit {
		bad("limits.max_json_depth", "must be from 2 to %d, got %d", ipc.MaxDepthLimit, d)
	}
	if c.Limits.MaxQueueBytes < c.Limits.MaxFrameBytes {
		bad("limits.max_queue_bytes", "must be at least limits.max_frame_bytes (%d)", c.Limits.MaxFrameBytes)
	}
	positive("limits.write_timeout", c.Limits.WriteTimeout)
	positive("limits.register_timeout", c.Limits.RegisterTimeout)
	positive("shutdown.timeout", c.Shutdown.Timeout)
	positive("deploy.ready_timeout", c.Deploy.ReadyTimeout)
	positive("deploy.quiesce_timeout", c.Deploy.QuiesceTimeout)
	for _, o := range c.Status.AllowedOrigins {
		if _, err := path.Match(o, ""); err != nil {
			bad("status.allowed_origins", "%q is not a valid pattern: %v", o, err)
		}
	}
	if c.API.TokenFile == "" && c.API.TokenEnv == "" {
		bad("api.token_file", "api.token_file or api.token_env must name where the API token is")
	}
	if c.API.MaxBodyBytes < 1 {
		bad("api.max_body_bytes", "must be at least 1, got %d", c.API.MaxBodyBytes)
	}
	positive("state.adopt_window", c.State.AdoptWindow)
	if c.Discord.TokenFile != "" && c.Discord.TokenEnv != "" {
		bad("discord.token_file", "set discord.token_file or discord.token_env, not both")
	}
	if u, err := url.Parse(c.Discord.APIBaseURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		bad("discord.api_base_url", "%q is not an http(s) URL", c.Discord.APIBaseURL)
	}
	positive("discord.identify_spacing", c.Discord.IdentifySpacing)
	positive("discord.identify_timeout", c.Discord.IdentifyTimeout)
	positive("discord.resume_max_age", c.Discord.ResumeMaxAge)
	if c.Discord.MaxConcurrency < 0 {
		bad("discord.max_concurrency", "must be 0 (from Discord) or more, got %d", c.Discord.MaxConcurrency)
	}
	if c.Discord.BudgetFloor < 0 {
		bad("discord.budget_floor", "must not be negative, got %d", c.Discord.BudgetFloor)
	}
	positive("api.read_timeout", c.API.ReadTimeout)
	positive("api.write_timeout", c.API.WriteTimeout)
	positive("api.idle_timeout", c.API.IdleTimeout)
	positive("api.request_timeout", c.API.RequestTimeout)
	if c.API.StatsMaxFields < 1 {
		bad("api.stats_max_fields", "must be at least 1, got %d", c.API.StatsMaxFields)
	}
	c.Mesh.validate(bad)
	c.Reshard.validate(c, bad)
	c.Recycle.validate(bad, c.Mesh.Enabled())
	return errors.Join(errs...)
}

// validate checks the [recycle] table; its values must be valid even while
// it is disabled.
func (r Recycle) validate(bad func(key, format string, args ...any), mesh bool) {
	if r.MaxRSS < 0 {
		bad("recycle.max_rss", "must be 0 (not watched) or more, got %d", r.MaxRSS)
	}
	if r.MaxHeap < 0 {
		bad("recycle.max_heap", "must be 0 (not watched) or more, got %d", r.MaxHeap)
	}
	if r.MaxLag.Duration < 0 {
		bad("recycle.max_lag", "must be 0 (not watched) or more, got %v", r.MaxLag.Duration)
	}
	if r.Sustain.Duration <= 0 {
		bad("recycle.sustain", "must be positive, got %v", r.Sustain.Duration)
	}
	if r.Interval.Duration <= 0 {
		bad("recycle.interval", "must be positive, got %v", r.Interval.Duration)
	}
	if r.MaxParallel < 1 {
		bad("recycle.max_parallel", "must be at least 1, got %d", r.MaxParallel)
	}
	if r.Cooldown.Duration < 0 {
		bad("recycle.cooldown", "must not be negative, got %v", r.Cooldown.Duration)
	}
	if r.Mode != "overlap" && r.Mode != "resume" {
		bad("recycle.mode", "must be \"overlap\" or \"resume\", got %q", r.Mode)
	}
	switch {
	case !r.Enabled:
	case r.MaxRSS == 0 && r.MaxHeap == 0 && r.MaxLag.Duration == 0:
		bad("recycle.enabled", "needs recycle.max_rss, recycle.max_heap or recycle.max_lag set")
	case mesh:
		bad("recycle.enabled", "recycling is not built for a mesh yet (deploys are not either)")
	}
}

// minLease is the shortest mesh.lease: a quarter of it is the fencing margin,
// which must leave room for killing a process group and a scheduler's hiccup.
const minLease = 2 * time.Second

// validate checks the [mesh] table. Nothing is required of it on a single
// host, but a value that is set must still be a valid one.
func (m Mesh) validate(bad func(key, format string, args ...any)) {
	if m.NATSURL != "" {
		for i, s := range strings.Split(m.NATSURL, ",") {
			// The errors never echo the URL: it might hold a password.
			u, err := url.Parse(strings.TrimSpace(s))
			if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
				bad("mesh.nats_url", "server %d is not a nats:// or tls:// URL with a host", i+1)
				continue
			}
			if u.User != nil {
				bad("mesh.nats_url", "holds credentials; use mesh.creds_file, mesh.token_file or mesh.user and mesh.password_file")
			}
		}
		if m.HostID == "" {
			bad("mesh.host_id", "must name this host when mesh.nats_url is set")
		}
	}
	if m.HostID != "" && !meshName.MatchString(m.HostID) {
		bad("mesh.host_id", "%q must be 1 to 64 letters, digits, '-' or '_'", m.HostID)
	}
	if !meshName.MatchString(m.Name) {
		bad("mesh.name", "%q must be 1 to 64 letters, digits, '-' or '_'", m.Name)
	}
	// JetStream allows at most 5 replicas of a stream.
	if m.Replicas < 1 || m.Replicas > 5 {
		bad("mesh.replicas", "must be from 1 to 5, got %d", m.Replicas)
	}
	if m.MaxClusters < 0 {
		bad("mesh.max_clusters", "must be 0 (no limit) or more, got %d", m.MaxClusters)
	}
	if m.MaxForwards < 1 {
		bad("mesh.max_forwards", "must be at least 1, got %d", m.MaxForwards)
	}
	if m.Lease.Duration < minLease {
		bad("mesh.lease", "must be at least %v, got %v", minLease, m.Lease.Duration)
	}
	auth := 0
	for _, set := range []bool{m.CredsFile != "", m.TokenFile != "", m.User != ""} {
		if set {
			auth++
		}
	}
	if auth > 1 {
		bad("mesh.creds_file", "set at most one of mesh.creds_file, mesh.token_file and mesh.user")
	}
	if (m.User == "") != (m.PasswordFile == "") {
		bad("mesh.password_file", "mesh.user and mesh.password_file go together")
	}
	if (m.CertFile == "") != (m.KeyFile == "") {
		bad("mesh.cert_file", "mesh.cert_file and mesh.key_file go together")
	}
}
