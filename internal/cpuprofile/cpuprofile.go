// Package cpuprofile starts a Go CPU profile written to a file: the hidden
// profiling switches of sm-manager (-cpuprofile) and cluster-harness
// (SM_HARNESS_CPUPROFILE_DIR) share it (docs/performance.md).
package cpuprofile

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// Start writes a CPU profile to path until the returned stop is called.
func Start(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
