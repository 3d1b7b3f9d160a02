package cpuprofile_test

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/sm-supervisor/sm/internal/cpuprofile"
)

func TestStartWritesAProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	stop, err := cpuprofile.Start(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A profile is a gzipped protocol buffer.
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("not a profile: %v", err)
	}
	if b, err := io.ReadAll(z); err != nil || len(b) == 0 {
		t.Fatalf("profile: %d bytes, %v", len(b), err)
	}
	if _, err := cpuprofile.Start(filepath.Join(t.TempDir(), "no", "such", "dir", "p")); err == nil {
		t.Error("a profile in a missing directory started")
	}
}
