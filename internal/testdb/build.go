package testdb

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Build builds Go commands for tests that run them as real processes, from a
// TestMain before Main: pkgs maps a package path (relative to the test's
// directory, like "." or "../crdbwork") to the name of its binary. It
// returns each binary's path by package. Under `go test` the binaries go into
// the test binary's directory, which go test removes afterwards (Main exits
// when the tests end, so nothing could remove them later); otherwise into a
// new temporary directory named after who.
func Build(who string, pkgs map[string]string) (map[string]string, error) {
	dir := filepath.Dir(os.Args[0])
	if !strings.Contains(dir, "go-build") {
		var err error
		if dir, err = os.MkdirTemp("", who+"-test-"); err != nil {
			return nil, fmt.Errorf("%s test: %w", who, err)
		}
	}
	out := make(map[string]string, len(pkgs))
	for pkg, name := range pkgs {
		bin := filepath.Join(dir, name)
		if runtime.GOOS == "windows" {
			bin += ".exe"
		}
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("%s test: building %s: %w", who, pkg, err)
		}
		out[pkg] = bin
	}
	return out, nil
}

// Environ is this process's environment without the variables whose names
// start with one of drop (like "DATABASE_URL=" or "CRDBWORK_"), plus extra:
// the environment of a command under test, so that only the test's own
// flags and variables count.
func Environ(drop []string, extra ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		for _, p := range drop {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
