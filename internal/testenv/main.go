// Package testenv is the scaffolding the module's tests share: binaries built
// once per test run, the goleak and leftover-process checks after it, and a
// manager running in-process on a small, fast topology.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// dir holds the binaries Main built.
var dir string

// Main is a TestMain: it builds build (the arguments of go build after -o:
// flags, then packages, relative to the test's directory) into a new temporary
// directory, runs the tests, and exits. When the tests pass, it fails the run
// for goroutines left running (goleak) and for processes left behind: zombie
// children of the test, or any process still running a binary it built.
func Main(m *testing.M, build ...string) {
	os.Exit(run(m, build))
}

func run(m *testing.M, build []string) int {
	d, err := os.MkdirTemp("", "sm-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(d)
	// /proc/pid/exe names the binary by its real path.
	if dir, err = filepath.EvalSymlinks(d); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if len(build) > 0 {
		cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, build...)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n", strings.Join(build, " "), err)
			return 2
		}
	}
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	if left := leftovers(); len(left) > 0 {
		fmt.Fprintln(os.Stderr, "processes left behind:", left)
		code = 1
	}
	return code
}

// Dir is the directory Main built the binaries into.
func Dir() string { return dir }

// Bin is the path of the binary Main built from the package named name.
func Bin(name string) string { return filepath.Join(dir, name) }

// leftovers lists zombie children of this process, and processes still
// running a binary Main built.
func leftovers() []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat) // pid (comm) state ppid ...
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(fields) < 2 {
			continue
		}
		if fields[0] == "Z" && fields[1] == self {
			out = append(out, "zombie "+e.Name())
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && filepath.Dir(exe) == dir {
			out = append(out, "orphan "+e.Name()+" "+filepath.Base(exe))
		}
	}
	return out
}
