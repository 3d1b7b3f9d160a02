package bench

import (
	"fmt"
	"os"
	"path/filepath"
)

// scratch is a scenario's temp dir, where its manager's socket and config go,
// and the log its processes write to.
type scratch struct {
	dir string
	log *os.File
}

// newScratch makes a temp dir named after pattern (as os.MkdirTemp) and
// creates the log in it as logName, or at logPath if that is set (a log kept
// after the run).
func newScratch(pattern, logName, logPath string) (*scratch, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return nil, err
	}
	if logPath == "" {
		logPath = filepath.Join(dir, logName)
	}
	logw, err := os.Create(logPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &scratch{dir: dir, log: logw}, nil
}

// close closes the log and removes the temp dir. It returns err with the
// tail of the log added, since a log in the dir goes with it.
func (s *scratch) close(err error) error {
	err = withLog(err, s.log)
	s.log.Close()
	os.RemoveAll(s.dir)
	return err
}

// withLog adds the tail of the children's log to err, since the log goes away
// with the temp dir.
func withLog(err error, logw *os.File) error {
	if err == nil {
		return nil
	}
	const tail = 4 << 10
	b, rerr := os.ReadFile(logw.Name())
	if rerr != nil || len(b) == 0 {
		return err
	}
	if len(b) > tail {
		b = b[len(b)-tail:]
	}
	return fmt.Errorf("%w\n--- tail of the processes' log ---\n%s", err, b)
}
