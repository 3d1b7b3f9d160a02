package manager_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// badCommands are cluster commands that cannot run. DEPLOY refuses them here;
// sm-manager -check refuses the same by the same rule (manager.CheckConfig,
// tested in cmd/sm-manager).
func badCommands(t *testing.T) map[string][]string {
	dir := t.TempDir()
	plain := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string][]string{
		"missing":        {filepath.Join(dir, "missing", "bot"), "--simulate"},
		"not executable": {plain},
		"a directory":    {dir},
		"not on PATH":    {"sm-no-such-command-7f3a"},
	}
}

func TestDeployRefusesCommandThatCannotRun(t *testing.T) {
	e := startFromFile(t, deployConfig(t))
	e.WaitReady()
	c := e.client("deployer")
	for name, argv := range badCommands(t) {
		_, err := e.redeploy(c, func(n *config.Config) { n.Cluster.Command = argv }, nil, 1)
		if ipc.CodeOf(err) != ipc.CodeBadConfig {
			t.Errorf("%s command %q: DEPLOY got %v, want bad_config", name, argv, err)
			e.waitDeploy(20 * time.Second)
		}
	}
	if st := e.MustStatus(); st.Deploy != nil || st.Generation != 1 {
		t.Fatalf("a refused deploy left a trace: %+v", st.Deploy)
	}
}

// TestSpawnFailureLogHasNoPath: logs at info are public, so a spawn that
// fails logs why without the command's path or arguments; the detail is
// only at DEBUG (and in the socket's STATUS).
func TestSpawnFailureLogHasNoPath(t *testing.T) {
	cfg := testConfig(t)
	release := filepath.Join(t.TempDir(), "release-9c1e")
	cfg.Cluster.Command = []string{filepath.Join(release, "bot"), "--secret-arg"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var info testenv.Buffer
	m := testenv.StartManager(t, manager.Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(&info, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	testenv.WaitFor(t, 10*time.Second, "a spawn failure logged", func() bool {
		return strings.Contains(info.String(), "spawn failed")
	})
	m.Stop()
	log := info.String()
	if !strings.Contains(log, "no such file or directory") {
		t.Errorf("the log does not say why the spawn failed:\n%s", log)
	}
	for _, s := range []string{release, "release-9c1e", "--secret-arg"} {
		if strings.Contains(log, s) {
			t.Errorf("the info log holds %q:\n%s", s, log)
		}
	}
}
