package config_test

import (
	"encoding"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDefaultsFromEmptyDocument(t *testing.T) {
	for _, doc := range []string{"", "\n", "# only a comment\n", "[topology]\n[limits]\n"} {
		cfg, err := config.Parse(doc)
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if want := config.Default(); !reflect.DeepEqual(*cfg, want) {
			t.Fatalf("Parse(%q) = %+v, want the defaults %+v", doc, *cfg, want)
		}
	}
	def := config.Default()
	if err := def.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
}

// The identify gate's default keeps a margin above Discord's 5 s: grants 5 s
// apart were measured reaching a gateway up to 49 ms closer (docs/discord.md).
func TestDefaultIdentifySpacingHasMargin(t *testing.T) {
	cfg, err := config.Parse("")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Discord.IdentifySpacing.Duration; got != 5500*time.Millisecond {
		t.Fatalf("default discord.identify_spacing = %v, want 5.5s", got)
	}
}

// TestDefaultIsFresh checks that Default does not hand out shared slices, so a
// decode into one config cannot change another.
func TestDefaultIsFresh(t *testing.T) {
	a := config.Default()
	a.Cluster.Command[0] = "changed"
	if b := config.Default(); b.Cluster.Command[0] == "changed" {
		t.Fatal("Default shares its Command slice between calls")
	}
	if _, err := config.Parse("[cluster]\ncommand = [\"mine\", \"--x\"]\n"); err != nil {
		t.Fatal(err)
	}
	if c := config.Default(); c.Cluster.Command[0] != "cluster-harness" {
		t.Fatalf("Parse changed the defaults: %q", c.Cluster.Command)
	}
}

func TestParseValues(t *testing.T) {
	doc := `
socket = "/tmp/x/sm.sock"
socket_mode = "0600"
allowed_uids = [0, 1000]
log_level = "debug"

[topology]
total_shards = 10
shards_per_cluster = 3

[cluster]
command = ["/usr/bin/bot", "--flag", "value with spaces"]
dir = "/srv/bot"
[cluster.env]
NODE_ENV = "production"
EMPTY = ""

[heartbeat]
interval = "1.5s"
timeout = "1m30s"

[restart]
backoff_min = "250ms"
backoff_max = "1h"
jitter = 0.0
intensity = 3

[limits]
max_frame_bytes = 2048
max_queue_bytes = 4096
`
	cfg, err := config.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.Socket = "/tmp/x/sm.sock"
	want.SocketMode = 0o600
	want.AllowedUIDs = []int{0, 1000}
	want.LogLevel = "debug"
	want.Topology = config.Topology{TotalShards: 10, ShardsPerCluster: 3}
	want.Cluster = config.Cluster{
		Command: []string{"/usr/bin/bot", "--flag", "value with spaces"},
		Dir:     "/srv/bot",
		Env:     map[string]string{"NODE_ENV": "production", "EMPTY": ""},
	}
	want.Heartbeat.Interval.Duration = 1500 * time.Millisecond
	want.Heartbeat.Timeout.Duration = 90 * time.Second
	want.Restart.BackoffMin.Duration = 250 * time.Millisecond
	want.Restart.BackoffMax.Duration = time.Hour
	want.Restart.Jitter = 0
	want.Restart.Intensity = 3
	want.Limits.MaxFrameBytes = 2048
	want.Limits.MaxQueueBytes = 4096
	if !reflect.DeepEqual(*cfg, want) {
		t.Fatalf("Parse =\n%+v\nwant\n%+v", *cfg, want)
	}
	if g := cfg.Topology.Generation(); g.Total != 10 || g.PerCluster != 3 {
		t.Fatalf("Topology.Generation() = %+v", g)
	}
}

// TestMesh: a single host by default, and a full [mesh] table as written.
func TestMesh(t *testing.T) {
	def := config.Default()
	if def.Mesh.Enabled() || def.Mesh.Lease.Duration != 10*time.Second || def.Mesh.Name != "sm" || def.Mesh.MaxForwards != 4096 {
		t.Fatalf("default mesh = %+v, want disabled, name sm, lease 10s, max_forwards 4096", def.Mesh)
	}
	cfg, err := config.Parse(`
[mesh]
nats_url = "nats://n1:4222, tls://n2:4222"
name = "bot-1"
host_id = "host_a"
max_clusters = 6
lease = "4s"
replicas = 3
max_forwards = 100
user = "sm"
password_file = "/etc/sm/nats-password"
ca_file = "/etc/sm/ca.pem"
cert_file = "/etc/sm/host.pem"
key_file = "/etc/sm/host.key"
`)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Mesh{
		NATSURL: "nats://n1:4222, tls://n2:4222", Name: "bot-1", HostID: "host_a", MaxClusters: 6,
		Lease: config.Duration{Duration: 4 * time.Second}, Replicas: 3, MaxForwards: 100, User: "sm", PasswordFile: "/etc/sm/nats-password",
		CAFile: "/etc/sm/ca.pem", CertFile: "/etc/sm/host.pem", KeyFile: "/etc/sm/host.key",
	}
	if cfg.Mesh != want || !cfg.Mesh.Enabled() {
		t.Fatalf("mesh = %+v, want %+v", cfg.Mesh, want)
	}
	for _, doc := range []string{"[mesh]\ncreds_file = \"/c\"", "[mesh]\ntoken_file = \"/t\"", "[mesh]\nhost_id = \"a\""} {
		if _, err := config.Parse(doc); err != nil {
			t.Errorf("Parse(%q): %v", doc, err)
		}
	}
	if _, err := config.Parse("[mesh]\nmax_forwards = 0"); err == nil || !strings.Contains(err.Error(), "mesh.max_forwards") {
		t.Fatalf("max_forwards = 0: err = %v", err)
	}
	if _, err := config.Parse("[mesh]\nnats_url = \"nats://x\"\nhost_id = \"a\"\nleases = \"5s\""); err == nil ||
		!strings.Contains(err.Error(), "mesh.leases") {
		t.Fatalf("unknown mesh key: err = %v", err)
	}
}

func TestFileMode(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want config.FileMode
	}{{`"0660"`, 0o660}, {`"660"`, 0o660}, {`"0600"`, 0o600}, {`"0"`, 0}, {`"777"`, 0o777}} {
		cfg, err := config.Parse("socket_mode = " + tt.in)
		if err != nil {
			t.Errorf("socket_mode = %s: %v", tt.in, err)
			continue
		}
		if cfg.SocketMode != tt.want {
			t.Errorf("socket_mode = %s parsed as %o, want %o", tt.in, cfg.SocketMode, tt.want)
		}
	}
	// Numbers are refused: 0o660 and 660 would be taken for other modes.
	for _, in := range []string{`"0999"`, `"1777"`, `"rw-rw----"`, `""`, `"-1"`, `0o660`, `660`, `432`, `true`} {
		_, err := config.Parse("socket_mode = " + in)
		if err == nil || !strings.Contains(err.Error(), "socket_mode") {
			t.Errorf("socket_mode = %s: err = %v, want an error naming socket_mode", in, err)
		}
	}
	if b, _ := config.FileMode(0o640).MarshalText(); string(b) != "0640" {
		t.Errorf("MarshalText = %s", b)
	}
}

func TestDuration(t *testing.T) {
	cfg, err := config.Parse("[deploy]\nready_timeout = \"2h45m\"\nquiesce_timeout = \"100ms\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Deploy.ReadyTimeout.Duration != 2*time.Hour+45*time.Minute || cfg.Deploy.QuiesceTimeout.Duration != 100*time.Millisecond {
		t.Fatalf("deploy = %+v", cfg.Deploy)
	}
	for _, in := range []string{`"5"`, `"soon"`, `5`, `1.5`, `""`} {
		_, err := config.Parse("[deploy]\nready_timeout = " + in + "\n")
		if err == nil || !strings.Contains(err.Error(), "deploy.ready_timeout") || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("ready_timeout = %s: err = %v, want one naming deploy.ready_timeout on line 2", in, err)
		}
	}
	if b, _ := (config.Duration{Duration: 90 * time.Second}).MarshalText(); string(b) != "1m30s" {
		t.Errorf("MarshalText = %s", b)
	}
}

// TestValidationNamesKey breaks one rule at a time and checks the error names
// the key at fault.
func TestValidationNamesKey(t *testing.T) {
	tests := []struct {
		key string // named in the error
		doc string
	}{
		{"socket", `socket = ""`},
		{"socket", `socket = "/` + strings.Repeat("s", 107) + `"`},
		{"allowed_uids", `allowed_uids = [1000, -1]`},
		{"log_level", `log_level = "verbose"`},
		{"log_level", `log_level = "INFO"`},
		{"topology.total_shards", "[topology]\ntotal_shards = 0"},
		{"topology.shards_per_cluster", "[topology]\nshards_per_cluster = -1"},
		{"cluster.command", "[cluster]\ncommand = []"},
		{"cluster.command", "[cluster]\ncommand = [\"\", \"x\"]"},
		{"cluster.env", "[cluster.env]\n\"A=B\" = \"x\""},
		{"cluster.env", "[cluster.env]\n\"\" = \"x\""},
		{"cluster.env", "[cluster.env]\nSM_TOKEN = \"forged\""},
		{"heartbeat.interval", "[heartbeat]\ninterval = \"0s\""},
		{"heartbeat.timeout", "[heartbeat]\ntimeout = \"-1s\""},
		{"heartbeat.timeout", "[heartbeat]\ninterval = \"5s\"\ntimeout = \"5s\""},
		{"restart.backoff_min", "[restart]\nbackoff_min = \"0s\""},
		{"restart.backoff_max", "[restart]\nbackoff_max = \"0s\""},
		{"restart.backoff_max", "[restart]\nbackoff_min = \"10s\"\nbackoff_max = \"5s\""},
		{"restart.jitter", "[restart]\njitter = -0.1"},
		{"restart.jitter", "[restart]\njitter = 1.0"},
		{"restart.intensity", "[restart]\nintensity = 0"},
		{"restart.period", "[restart]\nperiod = \"0s\""},
		{"restart.stop_grace", "[restart]\nstop_grace = \"0s\""},
		{"requests.timeout", "[requests]\ntimeout = \"0s\""},
		{"limits.max_frame_bytes", "[limits]\nmax_frame_bytes = 1023"},
		{"limits.max_queue", "[limits]\nmax_queue = 0"},
		{"limits.max_queue_bytes", "[limits]\nmax_frame_bytes = 4096\nmax_queue_bytes = 4095"},
		{"limits.max_pending", "[limits]\nmax_pending = 0"},
		{"limits.max_waiting", "[limits]\nmax_waiting = 0"},
		{"limits.max_connections", "[limits]\nmax_connections = 0"},
		{"limits.write_timeout", "[limits]\nwrite_timeout = \"0s\""},
		{"limits.register_timeout", "[limits]\nregister_timeout = \"0s\""},
		{"shutdown.timeout", "[shutdown]\ntimeout = \"0s\""},
		{"deploy.ready_timeout", "[deploy]\nready_timeout = \"0s\""},
		{"deploy.quiesce_timeout", "[deploy]\nquiesce_timeout = \"0s\""},
		{"limits.max_subscribers", "[limits]\nmax_subscribers = 0"},
		{"limits.feed_buffer", "[limits]\nfeed_buffer = 0"},
		{"limits.max_handoff_bytes", "[limits]\nmax_handoff_bytes = 0"},
		{"limits.max_json_depth", "[limits]\nmax_json_depth = 1"},
		{"limits.max_json_depth", "[limits]\nmax_json_depth = 10001"},
		{"status.allowed_origins", "[status]\nallowed_origins = [\"[bad\"]"},
		{"api.token_file", "[api]\ntoken_file = \"\"\ntoken_env = \"\""},
		{"api.max_body_bytes", "[api]\nmax_body_bytes = 0"},
		{"api.read_timeout", "[api]\nread_timeout = \"0s\""},
		{"api.write_timeout", "[api]\nwrite_timeout = \"0s\""},
		{"api.idle_timeout", "[api]\nidle_timeout = \"0s\""},
		{"api.request_timeout", "[api]\nrequest_timeout = \"0s\""},
		{"state.adopt_window", "[state]\nadopt_window = \"0s\""},
		{"mesh.nats_url", "[mesh]\nnats_url = \"http://x:4222\"\nhost_id = \"a\""},
		{"mesh.nats_url", "[mesh]\nnats_url = \"nats://a:4222,nats:///\"\nhost_id = \"a\""},
		{"mesh.nats_url", "[mesh]\nnats_url = \"nats://u:secret@x:4222\"\nhost_id = \"a\""},
		{"mesh.host_id", "[mesh]\nnats_url = \"nats://x:4222\""},
		{"mesh.host_id", "[mesh]\nhost_id = \"a.b\""},
		{"mesh.host_id", "[mesh]\nhost_id = \"" + strings.Repeat("h", 65) + "\""},
		{"mesh.name", "[mesh]\nname = \"\""},
		{"mesh.name", "[mesh]\nname = \"my bot\""},
		{"mesh.max_clusters", "[mesh]\nmax_clusters = -1"},
		{"mesh.replicas", "[mesh]\nreplicas = 0"},
		{"mesh.replicas", "[mesh]\nreplicas = 6"},
		{"mesh.lease", "[mesh]\nlease = \"1s\""},
		{"mesh.creds_file", "[mesh]\ncreds_file = \"/c\"\ntoken_file = \"/t\""},
		{"mesh.creds_file", "[mesh]\ntoken_file = \"/t\"\nuser = \"u\"\npassword_file = \"/p\""},
		{"mesh.password_file", "[mesh]\nuser = \"u\""},
		{"mesh.password_file", "[mesh]\npassword_file = \"/p\""},
		{"mesh.cert_file", "[mesh]\ncert_file = \"/c\""},
		{"mesh.cert_file", "[mesh]\nkey_file = \"/k\""},
		{"reshard.check_interval", "[reshard]\ncheck_interval = \"500ms\""},
		{"reshard.growth_ratio", "[reshard]\ngrowth_ratio = 0.9"},
		{"reshard.max_parallel", "[reshard]\nmax_parallel = 0"},
		{"reshard.enabled", "[reshard]\nenabled = true"},
		{"reshard.enabled", "[discord]\ntoken_env = \"T\"\n[topology]\ntotal_shards = \"auto\"\n[mesh]\nnats_url = \"nats://x:4222\"\nhost_id = \"a\"\n[reshard]\nenabled = true"},
		{"recycle.max_rss", "[recycle]\nmax_rss = -1"},
		{"recycle.max_heap", "[recycle]\nmax_heap = -1"},
		{"recycle.max_lag", "[recycle]\nmax_lag = \"-1s\""},
		{"recycle.sustain", "[recycle]\nsustain = \"0s\""},
		{"recycle.interval", "[recycle]\ninterval = \"0s\""},
		{"recycle.max_parallel", "[recycle]\nmax_parallel = 0"},
		{"recycle.cooldown", "[recycle]\ncooldown = \"-1s\""},
		{"recycle.mode", "[recycle]\nmode = \"sideways\""},
		{"recycle.enabled", "[recycle]\nenabled = true"},
		{"recycle.enabled", "[recycle]\nenabled = true\nmax_rss = 1\n[mesh]\nnats_url = \"nats://x:4222\"\nhost_id = \"a\""},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			_, err := config.Parse(tt.doc)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded", tt.doc)
			}
			if !strings.Contains(err.Error(), tt.key+":") {
				t.Fatalf("Parse(%q) = %q, want an error naming %s", tt.doc, err, tt.key)
			}
		})
	}
}

// TestValidateDirect covers what a file cannot express but a Config built in Go can.
func TestValidateDirect(t *testing.T) {
	cfg := config.Default()
	cfg.SocketMode = 0o1777
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "socket_mode:") {
		t.Fatalf("Validate = %v, want an error naming socket_mode", err)
	}
}

func TestValidationReportsEveryError(t *testing.T) {
	_, err := config.Parse("log_level = \"loud\"\n[topology]\ntotal_shards = 0\n[restart]\nintensity = 0\n")
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	for _, key := range []string{"log_level:", "topology.total_shards:", "restart.intensity:"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not mention %s", err, key)
		}
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		doc  string
		keys []string
	}{
		{"sockett = \"/x\"", []string{"sockett"}},
		{"[topology]\ntotal_shard = 8", []string{"topology.total_shard"}},
		{"[cluster]\ncmd = [\"x\"]", []string{"cluster.cmd"}},
		{"[nope]\na = 1", []string{"nope"}},
		{"typo = 1\n[deploy]\nready = \"1s\"", []string{"typo", "deploy.ready"}},
	}
	for _, tt := range tests {
		_, err := config.Parse(tt.doc)
		if err == nil {
			t.Errorf("Parse(%q) succeeded", tt.doc)
			continue
		}
		for _, k := range tt.keys {
			if !strings.Contains(err.Error(), k) {
				t.Errorf("Parse(%q) = %q, want it to name %s", tt.doc, err, k)
			}
		}
	}
}

func TestSyntaxErrorNamesLine(t *testing.T) {
	tests := []struct {
		doc  string
		line string
	}{
		{"socket = \"/x\"\nlog_level = \n", "line 2"},
		{"\n\n\ntotal_shards == 1\n", "line 4"},
		{"socket = \"/x\"\nsocket = \"/y\"\n", "line 2"},
		{"[topology]\ntotal_shards = \"sixteen\"\n", "line 2"},
		{"a = \"unterminated\n", "line 1"},
	}
	for _, tt := range tests {
		_, err := config.Parse(tt.doc)
		if err == nil || !strings.Contains(err.Error(), tt.line) {
			t.Errorf("Parse(%q) = %v, want an error naming %s", tt.doc, err, tt.line)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("sm.toml", []byte("log_level = \"warn\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("sm.toml")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Abs("sm.toml")
	if !filepath.IsAbs(cfg.Path) || cfg.Path != want {
		t.Fatalf("Path = %q, want %q", cfg.Path, want)
	}
	if cfg.LogLevel != "warn" {
		t.Fatalf("LogLevel = %q", cfg.LogLevel)
	}

	if _, err := config.Load("missing.toml"); err == nil || !os.IsNotExist(errorsUnwrapAll(err)) {
		t.Fatalf("Load(missing) = %v, want a not-exist error", err)
	}
	if err := os.WriteFile("bad.toml", []byte("[topology]\ntotal_shards = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load("bad.toml"); err == nil || !strings.Contains(err.Error(), "bad.toml") ||
		!strings.Contains(err.Error(), "topology.total_shards") {
		t.Fatalf("Load(bad) = %v, want an error naming the file and the key", err)
	}
}

func errorsUnwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

// configKeys returns the dotted TOML key of every leaf of Config: a value that
// is not itself a table of fields (maps and text-decoded types count as leaves).
func configKeys(t reflect.Type, prefix string) []string {
	textType := reflect.TypeFor[encoding.TextUnmarshaler]()
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		key := prefix + tag
		if f.Type.Kind() == reflect.Struct && !reflect.PointerTo(f.Type).Implements(textType) {
			keys = append(keys, configKeys(f.Type, key+".")...)
			continue
		}
		keys = append(keys, key)
	}
	return keys
}

const examplePath = "../config.example.toml"

// TestExampleConfig keeps config.example.toml honest: it loads and validates,
// it holds every key of Config, and every value in it is the default (but for
// the paths, which point somewhere any user can write, so it runs as-is).
func TestExampleConfig(t *testing.T) {
	cfg, err := config.Load(examplePath)
	if err != nil {
		t.Fatalf("the example config does not load: %v", err)
	}

	var raw map[string]any
	md, err := toml.DecodeFile(examplePath, &raw)
	if err != nil {
		t.Fatal(err)
	}
	keys := configKeys(reflect.TypeFor[config.Config](), "")
	if len(keys) < 30 {
		t.Fatalf("found only %d keys in Config; the walk is broken: %q", len(keys), keys)
	}
	for _, k := range keys {
		if !md.IsDefined(strings.Split(k, ".")...) {
			t.Errorf("config.example.toml does not document %s", k)
		}
	}

	want := config.Default()
	want.Socket = "/tmp/sm/sm.sock"
	want.State.Dir = "/tmp/sm/state"
	// The simulated bot has no real gateway: no need to space its identifies 5s.
	want.Discord.IdentifySpacing = config.Duration{Duration: 50 * time.Millisecond}
	want.Path = cfg.Path
	// An empty list or table in the file is the same as the default of none.
	emptyToNil(reflect.ValueOf(cfg).Elem())
	emptyToNil(reflect.ValueOf(&want).Elem())
	if !reflect.DeepEqual(*cfg, want) {
		t.Errorf("config.example.toml strays from the defaults:\n got %+v\nwant %+v", *cfg, want)
	}
}

// emptyToNil sets every empty slice and map inside v to nil.
func emptyToNil(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				emptyToNil(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 {
			v.SetZero()
		}
	}
}

// [reshard] with what it needs parses, and its defaults are the documented ones.
func TestReshard(t *testing.T) {
	if r := config.Default().Reshard; r.Enabled || r.CheckInterval.Duration != time.Hour || r.GrowthRatio != 1.5 || r.MaxParallel != 1 {
		t.Fatalf("defaults: %+v", r)
	}
	cfg, err := config.Parse("[discord]\ntoken_env = \"T\"\n[topology]\ntotal_shards = \"auto\"\n[reshard]\nenabled = true\ncheck_interval = \"10m\"\ngrowth_ratio = 1.2\nmax_parallel = 4")
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Reshard; !r.Enabled || r.CheckInterval.Duration != 10*time.Minute || r.GrowthRatio != 1.2 || r.MaxParallel != 4 {
		t.Fatalf("parsed: %+v", r)
	}
}
