package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

func TestMain(m *testing.M) {
	// The route scenario starts os.Executable() echo-cluster: in tests,
	// this binary, which then is the echo cluster.
	if len(os.Args) > 1 && os.Args[1] == echoClusterName {
		if err := Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Main(m, "../../cmd/sm-manager", "../../cmd/cluster-harness", "../../cmd/sm-api", "github.com/nats-io/nats-server/v2")
}

// runScenario runs sm-bench's scenario args[0] with the rest of args against the
// binaries TestMain built, within timeout, logs what it printed, and returns
// its output. It fails the test if the run fails, and is skipped under -short.
func runScenario(t *testing.T, timeout time.Duration, args ...string) *bytes.Buffer {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	bins := []string{"--manager-bin", testenv.Bin("sm-manager"), "--harness-bin", testenv.Bin("cluster-harness")}
	var out, progress bytes.Buffer
	err := Main(ctx, append(append(args[:1:1], bins...), args[1:]...), &out, &progress)
	t.Logf("progress:\n%s\noutput:\n%s", &progress, &out)
	if err != nil {
		t.Fatal(err)
	}
	return &out
}

// jsonLines returns the lines of r that are JSON objects (that start with {).
func jsonLines(t *testing.T, r io.Reader) []string {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "{") {
			lines = append(lines, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// jsonLine decodes the output's one JSON line into v.
func jsonLine(t *testing.T, r io.Reader, v any) {
	t.Helper()
	lines := jsonLines(t, r)
	if len(lines) != 1 {
		t.Fatalf("%d JSON lines, want 1", len(lines))
	}
	if err := json.Unmarshal([]byte(lines[0]), v); err != nil {
		t.Fatalf("JSON line %s: %v", lines[0], err)
	}
}
