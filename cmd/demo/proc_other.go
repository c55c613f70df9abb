//go:build !linux

package main

import "os/exec"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal; the demo stops its workers itself.
func setParentDeathSignal(*exec.Cmd) {}
