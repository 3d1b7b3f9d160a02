//go:build unix

package ipc

import "syscall"

// writeNonBlocking makes one write of buf to raw's socket without waiting for
// room: it returns how much the socket took (0 when it was full, or when the
// write is better left to the writer goroutine), and the error that ends the
// connection, if any.
func writeNonBlocking(raw syscall.RawConn, buf []byte) (int, error) {
	var (
		n   int
		err error
	)
	rerr := raw.Write(func(fd uintptr) bool {
		for {
			n, err = syscall.Write(int(fd), buf)
			if err != syscall.EINTR {
				return true // done either way: never wait for the socket
			}
		}
	})
	if rerr != nil {
		// The poller refused before writing: an expired write deadline (the
		// writer goroutine's, from its last write) or a closed socket. Leave
		// it to the writer goroutine, which owns both.
		return 0, nil
	}
	if n < 0 {
		n = 0
	}
	if err == syscall.EAGAIN {
		err = nil
	}
	return n, err
}
