package bench

import (
	"encoding/json"
	"testing"
	"time"
)

// TestManagerKillScenario runs a short manager-kill (8 clusters, one kill)
// against freshly built binaries: every cluster survives and is re-adopted,
// none is restarted, at most the requests in flight fail, none is lost or
// duplicated, and nothing is left running. Times are not asserted: a loaded
// machine under -race makes them meaningless.
func TestManagerKillScenario(t *testing.T) {
	out := runScenario(t, 2*time.Minute, "manager-kill",
		"--clusters=8", "--kills=1", "--inflight=8", "--rate=400", "--settle=500ms", "--after=500ms")
	var kills, summaries int
	for _, line := range jsonLines(t, out) {
		var c struct {
			killCase
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
