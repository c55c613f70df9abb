//go:build !linux

package dbserver

import "syscall"

// groupWithDeathSignal puts the server in its own process group, so Stop can
// kill it and anything it starts. Without a kernel parent-death signal, the
// watchdog and Stop are what end it.
func groupWithDeathSignal() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
