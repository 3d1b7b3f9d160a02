package manager_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
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
