// Package cli is the plumbing that crdbwork's two binaries share: the
// operator CLI (cmd/crdbwork) and the demo (cmd/demo). It holds the flag
// wrapper that reads each flag from the environment too, the console that
// keeps a live progress line, exit statuses and one-line error reports,
// the connect-and-check runner (a database URL checked, the server pinged,
// the crdbwork schema checked), JSON output and the version line.
//
// It is for internal use only: its API follows what the two binaries need
// and changes without notice. Programs use the claim, session, partition
// and worker packages.
package cli
