//go:build unix

package ipc

import "syscall"

// writeNonBlocking makes one write of buf to raw's socket without waiting for
// room: it returns how much the socket took (0 when it was full).
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
	if n < 0 {
		n = 0
	}
	if err == syscall.EAGAIN {
		err = nil
	}
	if err == nil {
		err = rerr
	}
	return n, err
}
