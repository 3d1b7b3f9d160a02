package harness

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/harness/harnesstest"
)

func TestMain(m *testing.M) {
	harnesstest.BotMain()
	goleak.VerifyTestMain(m)
}
