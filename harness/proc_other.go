//go:build !linux

package harness

import "syscall"

// childProcAttr keeps an exec child in the harness's process group. Outside
// Linux there is no parent-death signal.
func childProcAttr() *syscall.SysProcAttr { return nil }
