package main_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, ".") }

// writeConfig writes a config whose manager socket nobody serves.
func writeConfig(t *testing.T, api string) string {
	dir := t.TempDir()
	path := filepath.Join(dir, "sm.toml")
	doc := fmt.Sprintf("socket = %q\n\n[api]\nlisten = \"127.0.0.1:0\"\n%s\n", filepath.Join(dir, "sm.sock"), api)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRefusesToStartWithoutToken(t *testing.T) {
	cfg := writeConfig(t, `token_env = "SM_API_TEST_NO_SUCH_VAR"`)
	cmd := exec.Command(testenv.Bin("sm-api"), "-config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, output %s", err, out)
	}
	if !strings.Contains(string(out), "no API token") || !strings.Contains(string(out), "SM_API_TEST_NO_SUCH_VAR") {
		t.Fatalf("error does not say what is missing: %s", out)
	}
}

// Without a manager sm-api serves: healthy, not ready; SIGTERM stops it cleanly.
func TestServesAndStops(t *testing.T) {
	cfg := writeConfig(t, `token_env = "SM_API_TEST_TOKEN"`)
	cmd := exec.Command(testenv.Bin("sm-api"), "-config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "SM_API_TEST_TOKEN=0123456789abcdef0123"}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addrRe := regexp.MustCompile(`msg="sm-api serving" addr=(\S+)`)
	sc := bufio.NewScanner(stderr)
	var addr string
	for addr == "" && sc.Scan() {
		t.Log(sc.Text())
		if m := addrRe.FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatal("sm-api never said where it serves")
	}
	go io.Copy(io.Discard, stderr)
	hc := &http.Client{Timeout: 5 * time.Second}
	for path, status := range map[string]int{"/healthz": 200, "/readyz": 503, "/v1/status": 401, "/metrics": 200} {
		res, err := hc.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != status {
			t.Errorf("%s: %d, want %d", path, res.StatusCode, status)
		}
	}
	hc.CloseIdleConnections()
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sm-api after SIGTERM: %v", err)
		}
		t.Logf("stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("sm-api did not stop within 5s of SIGTERM")
	}
}
