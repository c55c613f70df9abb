package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the crdbwork release this binary belongs to (see CHANGELOG.md).
const Version = "0.5.0"

// VersionLine describes the binary named binary ("crdbwork demo", say): the
// crdbwork version, plus what the Go toolchain stamped into it (module
// version, VCS revision, Go version).
func VersionLine(binary string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", binary, Version)
	info, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintf(&b, " (%s, %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return b.String()
	}
	var extra []string
	if v := info.Main.Version; v != "" && v != "(devel)" {
		extra = append(extra, "module "+v)
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified == "true" {
			rev += "+dirty"
		}
		extra = append(extra, "commit "+rev)
	}
	extra = append(extra, info.GoVersion, runtime.GOOS+"/"+runtime.GOARCH)
	fmt.Fprintf(&b, " (%s)", strings.Join(extra, ", "))
	return b.String()
}

// PrintVersion prints VersionLine(binary) on w.
func PrintVersion(w io.Writer, binary string) { fmt.Fprintln(w, VersionLine(binary)) }
