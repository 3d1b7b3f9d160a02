package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// binDir holds sm-manager and cluster-harness, built once for the test run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sm-bench-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+"/", "../cmd/sm-manager", "../cmd/cluster-harness")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }
