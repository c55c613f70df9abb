package dbserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/testserver"
)

// DownloadEnv names the environment variable that, when set to a true value
// ("1", "true", "yes"), lets Start download CockroachDB when no cockroach
// binary is found, as Options.Download does.
const DownloadEnv = "CRDBWORK_DOWNLOAD_COCKROACH"

// CacheDirEnv names the environment variable that overrides the directory
// downloaded cockroach binaries are kept in (see CacheDir).
const CacheDirEnv = "CRDBWORK_CACHE_DIR"

// downloadHosts are dialled before a download, so that a machine without
// network (or without these hosts) fails in seconds with a clear message
// instead of waiting on a hung request. Tests replace them.
var downloadHosts = []string{
	"raw.githubusercontent.com:443", // the release list of the latest stable version
	"binaries.cockroachdb.com:443",  // the release archive
}

// dialTimeout bounds each reachability check.
const dialTimeout = 3 * time.Second

// CacheDir returns the directory downloaded cockroach binaries are kept in:
// $CRDBWORK_CACHE_DIR, else crdbwork in the user's cache directory
// (~/.cache/crdbwork on Linux).
func CacheDir() (string, error) {
	if dir := os.Getenv(CacheDirEnv); dir != "" {
		return dir, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("dbserver: no cache directory for cockroach downloads (set %s): %w", CacheDirEnv, err)
	}
	return filepath.Join(base, "crdbwork"), nil
}

// downloadWanted reports whether DownloadEnv asks for downloads.
func downloadWanted() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(DownloadEnv))) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// cachedCockroach returns the newest complete cockroach binary in the cache
// directory, or "" when there is none (or no cache directory). A download
// in progress, or one that was interrupted, is not complete: the
// downloader marks a finished binary read-and-execute only (mode 0555).
func cachedCockroach() string {
	dir, err := CacheDir()
	if err != nil {
		return ""
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	best, bestVer := "", []int(nil)
	for _, e := range entries {
		ver, ok := binaryVersion(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil || info.Mode().Perm() != 0o555 {
			continue
		}
		if best == "" || versionLess(bestVer, ver) {
			best, bestVer = filepath.Join(dir, e.Name()), ver
		}
	}
	return best
}

// binaryVersion parses the name the downloader gives a binary,
// "cockroach-v24.3.1", into its numbers.
func binaryVersion(name string) ([]int, bool) {
	rest, ok := strings.CutPrefix(name, "cockroach-v")
	if !ok {
		return nil, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return nil, false
	}
	ver := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, false
		}
		ver[i] = n
	}
	return ver, true
}

func versionLess(a, b []int) bool {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// DownloadCockroach returns a cockroach binary of the latest stable
// CockroachDB release for this machine, downloading it (about 100 MB) into
// CacheDir the first time; later calls, and Start, find it there. Before
// downloading it checks in seconds that the download hosts are reachable,
// and says so when they are not. It runs on Linux and macOS.
func DownloadCockroach(ctx context.Context, logf func(format string, args ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if bin := cachedCockroach(); bin != "" {
		return bin, nil
	}
	switch runtime.GOOS + "/" + runtime.GOARCH {
	case "linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64":
	default:
		return "", fmt.Errorf("dbserver: CockroachDB publishes no binary for %s/%s: install it yourself and set COCKROACH_BINARY", runtime.GOOS, runtime.GOARCH)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	for _, host := range downloadHosts {
		d := net.Dialer{Timeout: dialTimeout}
		c, err := d.DialContext(ctx, "tcp", host)
		if err != nil {
			return "", fmt.Errorf("dbserver: cannot download CockroachDB: %s is not reachable from this machine (%w); "+
				"download a cockroach binary yourself and set COCKROACH_BINARY, or run without the download (%s unset, Options.Download false) to use PostgreSQL", host, err, DownloadEnv)
		}
		c.Close()
	}
	logf("downloading the latest stable CockroachDB (about 100 MB) into %s; later runs use it from there", dir)
	type result struct {
		bin string
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The download cannot be cancelled; on ctx's end it finishes (or
		// fails) in the background, and a later call finds or redoes it.
		bin, err := testserver.DownloadBinaryWithPlatform(&testserver.TestConfig{}, "", false, runtime.GOOS, runtime.GOARCH, dir)
		done <- result{bin, err}
	}()
	select {
	case <-ctx.Done():
		return "", fmt.Errorf("dbserver: downloading CockroachDB into %s: %w", dir, ctx.Err())
	case r := <-done:
		if r.err != nil {
			return "", fmt.Errorf("dbserver: downloading CockroachDB into %s: %w", dir, r.err)
		}
		logf("downloaded %s", r.bin)
		if _, ok := binaryVersion(filepath.Base(r.bin)); !ok {
			logf("%s is not named cockroach-vX.Y.Z: later runs will not find it in the cache; set COCKROACH_BINARY=%s", r.bin, r.bin)
		}
		return r.bin, nil
	}
}

// cacheDirShown is CacheDir for messages.
func cacheDirShown() string {
	dir, err := CacheDir()
	if err != nil {
		return "the cache directory"
	}
	return dir
}
