package main

import (
	"strings"

	"github.com/crdbwork/crdbwork/internal/cli"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// tables are the crdbwork table names the demo uses: the defaults.
var tables = crsql.Tables{}

// prog is the demo binary for the shared command-line plumbing: its name
// in messages, and DEMO_ before its flags' variables.
var prog = cli.Program{Name: "demo", EnvPrefix: "DEMO_", URLVars: []string{"DATABASE_URL"}}

// verbose reports whether level shows info logs.
func verbose(level string) bool {
	l := strings.ToLower(level)
	return l == "debug" || l == "info"
}
