package manager_test

import (
	"testing"
	"time"

	"github.com/sm-supervisor/sm/manager"
)

// Every DEPLOY adds a generation's command; the ones nothing runs any more
// are forgotten when a deploy ends, so months of deploys keep a few.
func TestDeploysDoNotAccumulateGenerations(t *testing.T) {
	e := startFromFile(t, deployConfig(t))
	e.WaitReady()
	c := e.client("deployer")
	for i := range 4 {
		if _, err := e.redeploy(c, nil, nil, 4); err != nil {
			t.Fatalf("deploy %d: %v", i+1, err)
		}
		if st := e.waitDeploy(30 * time.Second); st.Deploy.State != "succeeded" {
			t.Fatalf("deploy %d: %s (%s)", i+1, st.Deploy.State, st.Deploy.Reason)
		}
	}
	// The old generation's processes may still be exiting: at most it and
	// the new one.
	if n := manager.SpecCount(e.Manager.Manager); n > 2 {
		t.Errorf("%d generation commands kept after 4 deploys, want at most 2", n)
	}
}
