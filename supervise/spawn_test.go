package supervise_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/supervise"
)

// spawn starts argv with s and makes sure it and its group are gone, and its
// exit reported, before the test ends.
func spawn(t *testing.T, s supervise.ExecSpawner, spec supervise.Spec) supervise.Process {
	t.Helper()
	p, err := s.Spawn(spec)
	if err != nil {
		t.Fatalf("Spawn(%q): %v", spec.Argv, err)
	}
	t.Cleanup(func() {
		// Not p.Signal: it is a no-op once the leader has exited, and a
		// failed test may leave the rest of the group behind.
		sigkill(p.PID())
		waitExited(t, p, 10*time.Second)
	})
	return p
}

// sh runs script with /bin/sh; args are $1, $2...
func sh(script string, args ...string) supervise.Spec {
	return supervise.Spec{Argv: append([]string{"/bin/sh", "-c", script, "sh"}, args...)}
}

func TestSpawnLeadsItsProcessGroup(t *testing.T) {
	t.Parallel()
	p := spawn(t, supervise.ExecSpawner{}, supervise.Spec{Argv: []string{"sleep", "60"}})
	state, pgrp, err := procStat(p.PID())
	if err != nil {
		t.Fatal(err)
	}
	if pgrp != p.PID() {
		t.Errorf("pid %d is in process group %d, want its own", p.PID(), pgrp)
	}
	if pgrp == syscall.Getpgrp() {
		t.Errorf("pid %d shares the test's process group %d", p.PID(), pgrp)
	}
	if state == "Z" || exited(p) {
		t.Errorf("pid %d: exited already (state %s)", p.PID(), state)
	}
}

func TestSpawnExitStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		script string
		want   string
	}{
		{"exit 0", "exit status 0"},
		{"exit 3", "exit status 3"},
		{"kill -KILL $$", "signal: killed"},
		{"kill -TERM $$", "signal: terminated"},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			t.Parallel()
			p := spawn(t, supervise.ExecSpawner{}, sh(tt.script))
			waitExited(t, p, 10*time.Second)
			if got := p.ExitStatus(); got != tt.want {
				t.Errorf("ExitStatus() = %q, want %q", got, tt.want)
			}
			// Reaped before the exit is reported.
			if _, _, err := procStat(p.PID()); err == nil {
				t.Errorf("pid %d still in /proc after Exited", p.PID())
			}
		})
	}
}

func TestSpawnSpec(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out, errOut testenv.Buffer
	s := supervise.ExecSpawner{Stdout: &out, Stderr: &errOut}
	p := spawn(t, s, supervise.Spec{
		Argv: []string{"/bin/sh", "-c", `echo "$SM_TEST_A $SM_TEST_B $(pwd -P)"; echo oops >&2`},
		Env:  []string{"SM_TEST_A=one", "SM_TEST_B=two words"},
		Dir:  dir,
	})
	waitExited(t, p, 10*time.Second)
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "one two words "+realDir+"\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got := errOut.String(); got != "oops\n" {
		t.Errorf("stderr = %q, want %q", got, "oops\n")
	}
}

func TestSpawnErrors(t *testing.T) {
	t.Parallel()
	for _, argv := range [][]string{nil, {}, {filepath.Join(t.TempDir(), "no-such-command")}} {
		if p, err := (supervise.ExecSpawner{}).Spawn(supervise.Spec{Argv: argv}); err == nil {
			sigkill(p.PID())
			<-p.Exited()
			t.Errorf("Spawn(%q) started pid %d, want an error", argv, p.PID())
		}
	}
}

// backgroundChild starts a shell that leaves a child running in the background,
// in its group, writes the child's pid to a file and exits 3 when told to.
// It returns the leader and the child's pid and start time, checked to be alive
// and in the leader's group.
func backgroundChild(t *testing.T, s supervise.ExecSpawner, quiet bool) (p supervise.Process, child int, start uint64, exit func()) {
	t.Helper()
	dir := t.TempDir()
	pidFile, goFile := filepath.Join(dir, "pid"), filepath.Join(dir, "go")
	redirect := ""
	if quiet {
		redirect = " >/dev/null 2>&1"
	}
	p = spawn(t, s, sh(`
		sleep 60`+redirect+` &
		echo $! >"$1"
		echo started
		while [ ! -e "$2" ]; do sleep 0.01; done
		exit 3`, pidFile, goFile))
	child = readPID(t, pidFile)
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) }) // if the test failed
	var err error
	if start, err = supervise.StartTime(child); err != nil {
		t.Fatalf("background child %d: %v", child, err)
	}
	if _, pgrp, err := procStat(child); err != nil || pgrp != p.PID() {
		t.Fatalf("background child %d is in group %d (%v), want the leader's %d", child, pgrp, err, p.PID())
	}
	return p, child, start, func() {
		if err := os.WriteFile(goFile, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// endedWithGroup checks that p ended with status, and that its background
// child, started at start, is gone too; what says what a child still there
// did ("survived Stop").
func endedWithGroup(t *testing.T, p supervise.Process, status string, child int, start uint64, what string) {
	t.Helper()
	if got := p.ExitStatus(); got != status {
		t.Errorf("ExitStatus() = %q, want %s", got, status)
	}
	if !eventually(10*time.Second, func() bool { return gone(child, start) }) {
		t.Errorf("background child %d %s", child, what)
	}
}

func TestSpawnLeaderExitKillsItsGroup(t *testing.T) {
	t.Parallel()
	// Output to a file, as the manager's own stdout is: no pipes.
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	p, child, start, exit := backgroundChild(t, supervise.ExecSpawner{Stdout: devNull, Stderr: devNull}, true)
	exit()
	waitExited(t, p, 10*time.Second)
	endedWithGroup(t, p, "exit status 3", child, start, "outlived its group's leader")
}

// TestSpawnLeaderExitKillsItsGroupWithOutputPipes: when the output goes to a
// writer that is not a file, os/exec copies it through a pipe the background
// child also holds; the leader's exit must still be reported, and the child
// killed, without waiting for the pipe to close.
func TestSpawnLeaderExitKillsItsGroupWithOutputPipes(t *testing.T) {
	t.Parallel()
	var out testenv.Buffer
	p, child, start, exit := backgroundChild(t, supervise.ExecSpawner{Stdout: &out, Stderr: &out}, false)
	exit()
	waitExited(t, p, 10*time.Second)
	endedWithGroup(t, p, "exit status 3", child, start, "outlived its group's leader")
	// The output is complete when the exit is reported.
	if got := out.String(); got != "started\n" {
		t.Errorf("output = %q, want %q", got, "started\n")
	}
}

// TestSpawnEscapedChildHoldingOutputPipes: a child that left the group (so is
// not killed with it) and holds the output pipe delays the exit report by
// at most a moment, and the status is still the leader's.
func TestSpawnEscapedChildHoldingOutputPipes(t *testing.T) {
	t.Parallel()
	var out testenv.Buffer
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := spawn(t, supervise.ExecSpawner{Stdout: &out, Stderr: &out}, sh(`
		setsid sleep 60 &
		echo $! >"$1"
		exit 0`, pidFile))
	child := readPID(t, pidFile)
	t.Cleanup(func() { sigkill(child) }) // the leader of its own group now
	waitExited(t, p, 10*time.Second)
	if got := p.ExitStatus(); got != "exit status 0" {
		t.Errorf("ExitStatus() = %q, want exit status 0", got)
	}
}

func TestSignalAfterExitIsNoop(t *testing.T) {
	t.Parallel()
	p := spawn(t, supervise.ExecSpawner{}, sh("exit 0"))
	waitExited(t, p, 10*time.Second)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := p.Signal(sig); err != nil {
			t.Errorf("Signal(%v) after exit: %v", sig, err)
		}
	}
}

// ignoresTERM starts a group whose leader and background child both ignore
// SIGTERM, and waits until the trap is set.
func ignoresTERM(t *testing.T) (p supervise.Process, child int, start uint64) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	p = spawn(t, supervise.ExecSpawner{}, sh(`
		trap "" TERM
		sleep 60 &
		echo $! >"$1"
		wait`, pidFile))
	child = readPID(t, pidFile)
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) }) // if the test failed
	var err error
	if start, err = supervise.StartTime(child); err != nil {
		t.Fatalf("background child %d: %v", child, err)
	}
	return p, child, start
}

func TestStop(t *testing.T) {
	t.Parallel()

	t.Run("exits on SIGTERM within grace", func(t *testing.T) {
		t.Parallel()
		p := spawn(t, supervise.ExecSpawner{}, supervise.Spec{Argv: []string{"sleep", "60"}})
		const grace = 30 * time.Second
		begin := time.Now()
		if err := supervise.Stop(context.Background(), p, grace); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(begin); took >= grace {
			t.Errorf("Stop took %v, the whole grace period", took)
		}
		if !exited(p) {
			t.Fatal("Stop returned before the exit was reported")
		}
		if got := p.ExitStatus(); got != "signal: terminated" {
			t.Errorf("ExitStatus() = %q, want signal: terminated", got)
		}
	})

	t.Run("ignores SIGTERM: killed after grace", func(t *testing.T) {
		t.Parallel()
		p, child, start := ignoresTERM(t)
		const grace = 300 * time.Millisecond
		begin := time.Now()
		if err := supervise.Stop(context.Background(), p, grace); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(begin); took < grace {
			t.Errorf("Stop took %v, less than the grace period %v", took, grace)
		}
		if !exited(p) {
			t.Fatal("Stop returned before the exit was reported")
		}
		endedWithGroup(t, p, "signal: killed", child, start, "survived Stop")
	})

	t.Run("cancelled context kills at once", func(t *testing.T) {
		t.Parallel()
		p, child, start := ignoresTERM(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		begin := time.Now()
		err := supervise.Stop(ctx, p, time.Hour)
		// The SIGKILL is sent; whether its exit is seen before Stop gives up
		// on the done context is a race.
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Stop = %v, want nil or context.Canceled", err)
		}
		if err == nil && !exited(p) {
			t.Error("Stop returned nil before the exit was reported")
		}
		if took := time.Since(begin); took > 10*time.Second {
			t.Errorf("Stop took %v", took)
		}
		waitExited(t, p, 10*time.Second)
		endedWithGroup(t, p, "signal: killed", child, start, "survived Stop")
	})

	t.Run("context ends the grace period early", func(t *testing.T) {
		t.Parallel()
		p, _, _ := ignoresTERM(t)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		begin := time.Now()
		err := supervise.Stop(ctx, p, time.Hour)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Stop = %v, want nil or context.DeadlineExceeded", err)
		}
		if took := time.Since(begin); took > 10*time.Second {
			t.Errorf("Stop took %v", took)
		}
		waitExited(t, p, 10*time.Second)
		if got := p.ExitStatus(); got != "signal: killed" {
			t.Errorf("ExitStatus() = %q, want signal: killed", got)
		}
	})

	t.Run("already exited", func(t *testing.T) {
		t.Parallel()
		p := spawn(t, supervise.ExecSpawner{}, sh("exit 0"))
		waitExited(t, p, 10*time.Second)
		if err := supervise.Stop(context.Background(), p, time.Hour); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
}

func TestResolveCommand(t *testing.T) {
	// A PATH of one directory, so the bare-name lookups are deterministic.
	pathDir := t.TempDir()
	writeExec(t, filepath.Join(pathDir, "sm-test-cluster"), 0o755)
	writeExec(t, filepath.Join(pathDir, "sm-test-not-executable"), 0o644)
	t.Setenv("PATH", pathDir)

	const base = "/srv/sm"
	tests := []struct {
		name string
		argv []string
		want []string // nil: an error
	}{
		{"absolute path kept", []string{"/opt/bin/cluster", "-v"}, []string{"/opt/bin/cluster", "-v"}},
		{"relative path joined with base", []string{"bin/cluster", "-v"}, []string{"/srv/sm/bin/cluster", "-v"}},
		{"dot path joined with base", []string{"./cluster"}, []string{"/srv/sm/cluster"}},
		{"dot-dot path joined with base", []string{"../other/cluster"}, []string{"/srv/other/cluster"}},
		{"bare name found in PATH", []string{"sm-test-cluster", "a", "b"}, []string{filepath.Join(pathDir, "sm-test-cluster"), "a", "b"}},
		{"bare name not executable", []string{"sm-test-not-executable"}, nil},
		{"bare name missing", []string{"sm-test-no-such-command"}, nil},
		{"empty", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.argv)
			got, err := supervise.ResolveCommand(tt.argv, base)
			if tt.want == nil {
				if err == nil {
					t.Errorf("ResolveCommand(%q) = %q, want an error", tt.argv, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveCommand(%q): %v", tt.argv, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ResolveCommand(%q) = %q, want %q", tt.argv, got, tt.want)
			}
			if !slices.Equal(tt.argv, in) {
				t.Errorf("ResolveCommand changed its argument to %q", tt.argv)
			}
		})
	}

	t.Run("missing name wraps exec.ErrNotFound", func(t *testing.T) {
		_, err := supervise.ResolveCommand([]string{"sm-test-no-such-command"}, base)
		if !errors.Is(err, exec.ErrNotFound) {
			t.Errorf("err = %v, want exec.ErrNotFound", err)
		}
	})

	// A release directory works as a unit: a bare name beside the manager's
	// own executable (here the test binary) wins over PATH.
	t.Run("bare name beside the executable first", func(t *testing.T) {
		self, err := os.Executable()
		if err != nil {
			t.Skip(err)
		}
		beside := filepath.Join(filepath.Dir(self), "sm-test-cluster")
		if err := os.WriteFile(beside, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Skipf("cannot write beside the test binary: %v", err)
		}
		t.Cleanup(func() { os.Remove(beside) })
		got, err := supervise.ResolveCommand([]string{"sm-test-cluster"}, base)
		if err != nil || got[0] != beside {
			t.Errorf("ResolveCommand = %q, %v; want %s", got, err, beside)
		}
	})
}

func writeExec(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), mode); err != nil {
		t.Fatal(err)
	}
}

func TestStartTime(t *testing.T) {
	t.Parallel()

	self, err := supervise.StartTime(os.Getpid())
	if err != nil || self == 0 {
		t.Fatalf("StartTime(self) = %d, %v; want > 0", self, err)
	}
	if again, err := supervise.StartTime(os.Getpid()); err != nil || again != self {
		t.Errorf("StartTime(self) again = %d, %v; want %d", again, err, self)
	}

	t.Run("child started later", func(t *testing.T) {
		cmd := testenv.Sleeper(t, false)
		got, err := supervise.StartTime(cmd.Process.Pid)
		if err != nil || got < self {
			t.Errorf("StartTime(child) = %d, %v; want at least the parent's %d", got, err, self)
		}
	})

	t.Run("nonexistent pid", func(t *testing.T) {
		if _, err := supervise.StartTime(unusedPID(t)); !errors.Is(err, supervise.ErrGone) {
			t.Errorf("err = %v, want ErrGone", err)
		}
	})

	t.Run("zombie", func(t *testing.T) {
		pid, reap := zombie(t)
		defer reap()
		if got, err := supervise.StartTime(pid); !errors.Is(err, supervise.ErrGone) {
			t.Errorf("StartTime(zombie) = %d, %v; want ErrGone", got, err)
		}
	})
}

// zombie starts a child that exits at once and leaves it unreaped until reap.
func zombie(t *testing.T) (pid int, reap func()) {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid = cmd.Process.Pid
	if !eventually(10*time.Second, func() bool {
		state, _, err := procStat(pid)
		return err == nil && state == "Z"
	}) {
		cmd.Wait()
		t.Fatalf("pid %d never became a zombie", pid)
	}
	return pid, func() { cmd.Wait() }
}

// TestSpawnSameWriterForBothStreams: with one writer for both streams, writes
// arrive whole and one at a time (os/exec shares one pipe between them).
func TestSpawnSameWriterForBothStreams(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer // not safe for concurrent use: a race if both streams write at once
	p := spawn(t, supervise.ExecSpawner{Stdout: &out, Stderr: &out}, sh(`
		i=0
		while [ $i -lt 50 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done`))
	waitExited(t, p, 10*time.Second)
	// The copying is over by the time the exit is reported.
	var lines int
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !strings.HasPrefix(l, "out") && !strings.HasPrefix(l, "err") {
			t.Errorf("mangled line %q", l)
		}
		lines++
	}
	if lines != 100 {
		t.Errorf("%d lines, want 100", lines)
	}
}
