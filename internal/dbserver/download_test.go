package dbserver

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// noCockroach hides every cockroach binary of the machine from the test: an
// empty PATH, no COCKROACH_BINARY, an empty cache directory (returned) and
// download hosts that refuse connections.
func noCockroach(t *testing.T) (cache string) {
	t.Helper()
	cache = t.TempDir()
	t.Setenv("PATH", t.TempDir())
	t.Setenv("COCKROACH_BINARY", "")
	t.Setenv(CacheDirEnv, cache)
	t.Setenv(DownloadEnv, "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close() // nothing listens there now: dials are refused at once
	old := downloadHosts
	downloadHosts = []string{closed}
	t.Cleanup(func() { downloadHosts = old })
	return cache
}

// writeBinary writes an executable shell script named name into dir with
// the given permission bits.
func writeBinary(t *testing.T, dir, name, script string, perm os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCachedCockroachPicksNewestFinishedBinary(t *testing.T) {
	cache := noCockroach(t)
	if got := cachedCockroach(); got != "" {
		t.Fatalf("empty cache: got %q", got)
	}
	writeBinary(t, cache, "cockroach-v9.2.1", "exit 0", 0o555)
	want := writeBinary(t, cache, "cockroach-v24.10.0", "exit 0", 0o555) // numerically newest
	writeBinary(t, cache, "cockroach-v24.9.3", "exit 0", 0o555)
	writeBinary(t, cache, "cockroach-v25.1.0", "exit 0", 0o600) // a download in progress
	writeBinary(t, cache, "cockroach-latest", "exit 0", 0o555)  // not a release
	writeBinary(t, cache, "cockroach-v26.1", "exit 0", 0o555)   // not a release name
	if err := os.Mkdir(filepath.Join(cache, "cockroach-v30.0.0"), 0o555); err != nil {
		t.Fatal(err)
	}
	if got := cachedCockroach(); got != want {
		t.Fatalf("cachedCockroach = %q, want %q", got, want)
	}
	if got, err := findCockroach(); err != nil || got != want {
		t.Fatalf("findCockroach = %q, %v; want the cached %q", got, err, want)
	}
	// A binary on PATH wins over the cache.
	onPath := writeBinary(t, t.TempDir(), "cockroach", "exit 0", 0o755)
	t.Setenv("PATH", filepath.Dir(onPath))
	if got, err := findCockroach(); err != nil || got != onPath {
		t.Fatalf("findCockroach = %q, %v; want PATH's %q", got, err, onPath)
	}
}

func TestDownloadOfflineFailsFastAndClearly(t *testing.T) {
	noCockroach(t)
	begin := time.Now()
	_, err := DownloadCockroach(testCtx(t), t.Logf)
	if err == nil {
		t.Fatal("DownloadCockroach with unreachable hosts succeeded")
	}
	t.Logf("failed after %v: %v", time.Since(begin), err)
	for _, want := range []string{"not reachable", "COCKROACH_BINARY", DownloadEnv} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// Asked for through Options or the environment, a failed download is
	// Start's error, not a silent fall back to PostgreSQL.
	for _, env := range []string{"", "1"} {
		t.Setenv(DownloadEnv, env)
		_, err := Start(testCtx(t), Options{Download: env == ""})
		if err == nil || errors.Is(err, ErrNoServer) || !strings.Contains(err.Error(), "not reachable") {
			t.Errorf("Start with %s=%q: err = %v, want the download's error", DownloadEnv, env, err)
		}
	}
}

func TestStartUsesTheCachedBinary(t *testing.T) {
	cache := noCockroach(t)
	// A cached "cockroach" that fails at once: Start must try it (and report
	// its output), not download and not fall back to PostgreSQL.
	writeBinary(t, cache, "cockroach-v99.0.0", `echo "fake cockroach: $1" >&2; exit 3`, 0o555)
	_, err := Start(testCtx(t), Options{Download: true})
	if err == nil {
		t.Fatal("Start with a failing cached cockroach succeeded")
	}
	if !strings.Contains(err.Error(), "fake cockroach: start-single-node") {
		t.Fatalf("err = %v, want the cached binary's output", err)
	}
	// With a cached binary no download is attempted.
	bin, err := DownloadCockroach(testCtx(t), t.Logf)
	if err != nil || filepath.Base(bin) != "cockroach-v99.0.0" {
		t.Fatalf("DownloadCockroach = %q, %v; want the cached binary", bin, err)
	}
}
