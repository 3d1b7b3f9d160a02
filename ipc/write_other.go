//go:build !unix

package ipc

import "syscall"

// writeNonBlocking writes nothing: without a non-blocking write, everything
// goes through the writer goroutine.
func writeNonBlocking(syscall.RawConn, []byte) (int, error) { return 0, nil }
