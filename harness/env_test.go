package harness

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func mapEnv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func goodEnv() map[string]string {
	return map[string]string{
		EnvSocket: "/run/sm.sock", EnvCluster: "1", EnvGeneration: "7",
		EnvShardFirst: "4", EnvShardLast: "6", EnvTotalShards: "8", EnvToken: "tok",
	}
}

func TestParseEnv(t *testing.T) {
	e, err := ParseEnv(mapEnv(goodEnv()))
	if err != nil {
		t.Fatal(err)
	}
	want := Env{Socket: "/run/sm.sock", Cluster: 1, Generation: 7, ShardFirst: 4, ShardLast: 6, TotalShards: 8, Token: "tok"}
	if e != want {
		t.Fatalf("ParseEnv = %+v, want %+v", e, want)
	}
	if e.Shards() != 3 || !e.Owns(4) || !e.Owns(6) || e.Owns(3) || e.Owns(7) {
		t.Errorf("Shards/Owns wrong for %+v", e)
	}

	for _, tc := range []struct {
		name string
		set  map[string]string
		want []string // substrings of the error
	}{
		{"missing socket and token", map[string]string{EnvSocket: "", EnvToken: ""}, []string{"SM_SOCKET is not set", "SM_TOKEN is not set"}},
		{"not a number", map[string]string{EnvCluster: "x"}, []string{`SM_CLUSTER="x"`}},
		{"negative", map[string]string{EnvGeneration: "-1"}, []string{"SM_GENERATION"}},
		{"range reversed", map[string]string{EnvShardFirst: "6", EnvShardLast: "4"}, []string{"SM_SHARD_FIRST=6 is after SM_SHARD_LAST=4"}},
		{"range past total", map[string]string{EnvShardLast: "8"}, []string{"SM_SHARD_LAST=8 is not below SM_TOTAL_SHARDS=8"}},
		{"no shards", map[string]string{EnvTotalShards: "0", EnvShardFirst: "0", EnvShardLast: "0"}, []string{"at least 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := goodEnv()
			for k, v := range tc.set {
				env[k] = v
			}
			_, err := ParseEnv(mapEnv(env))
			if err == nil {
				t.Fatal("ParseEnv accepted a bad environment")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestChildEnv(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "SM_TOKEN=secret", "SM_CLUSTER=1", "SM_HARNESS_FLAGS=--x", "SM_HARNESS_FLAGS_1=--y", "SM_TOKENISH=kept"})
	want := []string{"PATH=/bin", "SM_CLUSTER=1", "SM_TOKENISH=kept"}
	if !slices.Equal(got, want) {
		t.Fatalf("childEnv = %q, want %q", got, want)
	}
}

func TestParseArgs(t *testing.T) {
	parse := func(args []string, extra map[string]string) (Config, error) {
		env := goodEnv()
		for k, v := range extra {
			env[k] = v
		}
		return ParseArgs("cluster-harness", args, mapEnv(env), io.Discard)
	}

	t.Run("defaults", func(t *testing.T) {
		c, err := parse(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.Mode != ModeSimulate || c.ExitOnStart != nil || c.Sim.ConnectDelay != 100*time.Millisecond ||
			c.Sim.EventInterval != 200*time.Millisecond || c.Sim.HeartbeatInterval != time.Second || c.Sim.OpDelay != 0 ||
			c.ShutdownTimeout != 5*time.Second || c.MaxFrameBytes != 1<<20 || c.Env.Cluster != 1 ||
			c.Sim.IdentifyTimeout != 10*time.Minute || c.Sim.IdentifyRetry != 5*time.Second {
			t.Errorf("defaults: %+v", c)
		}
	})
	t.Run("env flags win, per cluster last", func(t *testing.T) {
		c, err := parse([]string{"--connect-delay", "1s", "--op-delay=1s"}, map[string]string{
			EnvFlags:        "--connect-delay 0 --fail-ready",
			EnvFlags + "_1": "--op-delay 2s --exit-on-start 9",
			EnvFlags + "_2": "--crash-after 1s", // another cluster's
		})
		if err != nil {
			t.Fatal(err)
		}
		if c.Sim.ConnectDelay != 0 || !c.Sim.FailReady || c.Sim.OpDelay != 2*time.Second || c.ExitOnStart == nil || *c.ExitOnStart != 9 || c.Sim.CrashAfter != 0 {
			t.Errorf("got %+v", c)
		}
	})
	t.Run("exec", func(t *testing.T) {
		c, err := parse([]string{"--exec", "--", "python3", "-u", "bot.py", "--flag"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.Mode != ModeExec || !slices.Equal(c.Command, []string{"python3", "-u", "bot.py", "--flag"}) {
			t.Errorf("got mode %v command %q", c.Mode, c.Command)
		}
	})
	t.Run("help", func(t *testing.T) {
		if _, err := parse([]string{"-h"}, nil); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("-h: %v", err)
		}
	})
	for _, tc := range []struct {
		name  string
		args  []string
		extra map[string]string
		want  string
	}{
		{"exec without command", []string{"--exec"}, nil, "needs a command"},
		{"exec with sim flag", []string{"--exec", "--fail-ready", "--", "bot"}, nil, "--fail-ready is for the simulated bot"},
		{"sim with command", []string{"bot.py"}, nil, `unexpected argument "bot.py"`},
		{"negative delay", []string{"--connect-delay=-1s"}, nil, "--connect-delay must not be negative"},
		{"zero heartbeat", []string{"--heartbeat-interval=0"}, nil, "--heartbeat-interval must be positive"},
		{"zero identify timeout", []string{"--identify-timeout=0"}, nil, "--identify-timeout must be positive"},
		{"zero identify retry", []string{"--identify-retry=0s"}, nil, "--identify-retry must be positive"},
		{"exec with identify flag", []string{"--exec", "--identify-retry=1s", "--", "bot"}, nil, "--identify-retry is for the simulated bot"},
		{"exit code range", []string{"--exit-on-start=300"}, nil, "--exit-on-start"},
		{"log format", []string{"--log-format=xml"}, nil, "--log-format"},
		{"unknown flag", []string{"--nope"}, nil, "not defined"},
		{"env positional", nil, map[string]string{EnvFlags: "--fail-ready stray"}, `SM_HARNESS_FLAGS: unexpected argument "stray"`},
		{"env unknown flag", nil, map[string]string{EnvFlags: "--nope"}, "SM_HARNESS_FLAGS"},
		{"bad env", nil, map[string]string{EnvToken: ""}, "SM_TOKEN is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(tc.args, tc.extra)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
