package dbserver

import "syscall"

// groupWithDeathSignal puts the server in its own process group, so Stop can
// kill it and anything it starts, and has the kernel SIGKILL it if the thread
// that started it goes away.
func groupWithDeathSignal() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
