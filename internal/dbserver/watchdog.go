package dbserver

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// A watchdog is a small shell process that cleans up a server if this
// process dies without calling Stop. It blocks reading a pipe whose only
// writer is this process (the write end is close-on-exec, so no other child
// inherits it); when this process exits for any reason, the read sees EOF
// and the watchdog runs its cleanup script. Stop kills the watchdog first
// and cleans up itself. It runs in its own process group so a terminal's
// Ctrl-C, which kills the test binary, does not also kill the watchdog.
type watchdog struct {
	cmd  *exec.Cmd
	w    *os.File // held open until cancel; closing it triggers the cleanup
	done chan struct{}
}

// startWatchdog starts `sh -c 'cat >/dev/null; <script>' watchdog args...`
// with the given credentials (nil: this process's).
func startWatchdog(script string, cred *syscall.Credential, args ...string) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog pipe: %w", err)
	}
	argv := append([]string{"-c", "cat >/dev/null\n" + script, "crdbwork-dbserver-watchdog"}, args...)
	cmd := exec.Command("/bin/sh", argv...)
	cmd.Stdin = r
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start watchdog: %w", err)
	}
	r.Close()
	wd := &watchdog{cmd: cmd, w: w, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(wd.done)
	}()
	return wd, nil
}

// cancel kills the watchdog without letting it run its cleanup.
func (wd *watchdog) cancel() {
	if wd == nil {
		return
	}
	select {
	case <-wd.done:
		// Already exited and reaped: its pid may belong to someone else now.
	default:
		// The watchdog leads its own process group (sh and its cat).
		_ = syscall.Kill(-wd.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-wd.done:
	case <-time.After(10 * time.Second):
	}
	wd.w.Close()
}
