package harness

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/harness/harnesstest"
)

// botArg, as the first argument, makes the test binary run harnesstest.Bot
// instead of the tests: the child of the exec bridge tests (go-plugin's
// helper-process pattern, caught before the testing package prints anything).
const botArg = "harnesstest-bot"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == botArg {
		os.Exit(harnesstest.Bot(os.Stdin, os.Stdout, os.Getenv))
	}
	// A -race child sleeps a second at exit (GORACE atexit_sleep_ms) to let
	// late races surface; the children here are short-lived bots, and the
	// tests wait for their exit.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	goleak.VerifyTestMain(m)
}
