package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestManagerKillScenario runs a short manager-kill (8 clusters, one kill)
// against freshly built binaries: every cluster survives and is re-adopted,
// none is restarted, at most the requests in flight fail, none is lost or
// duplicated, and nothing is left running. Times are not asserted: a loaded
// machine under -race makes them meaningless.
func TestManagerKillScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, progress bytes.Buffer
	err := Main(ctx, []string{"manager-kill",
		"--manager-bin", bin("sm-manager"), "--harness-bin", bin("cluster-harness"),
		"--clusters=8", "--kills=1", "--inflight=8", "--rate=400", "--settle=500ms", "--after=500ms",
	}, &out, &progress)
	t.Logf("progress:\n%s\noutput:\n%s", &progress, &out)
	if err != nil {
		t.Fatal(err)
	}
	var kills, summaries int
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var c struct {
			KillCase
			LeftBehind int `json:"left_behind"`
			Restarted  int `json:"restarted"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		switch c.Path {
		case "kill":
			kills++
			if c.Survived != 8 || c.Restarted != 0 || c.ReadoptedS <= 0 || c.RoutedS < c.ReadoptedS || c.OK == 0 {
				t.Errorf("kill: %s", line)
			}
		case "summary":
			summaries++
			if c.Lost != 0 || c.Duplicates != 0 || c.ErrorCount() > 8 || c.LeftBehind != 0 || c.OK == 0 {
				t.Errorf("summary: %s", line)
			}
		default:
			t.Errorf("unexpected line %s", line)
		}
	}
	if kills != 1 || summaries != 1 {
		t.Fatalf("%d kill lines, %d summaries; want 1, 1", kills, summaries)
	}
}
