package main

import (
	"errors"
	"strings"

	"github.com/crdbwork/crdbwork/internal/cli"
)

// common are the flags of every subcommand.
type common struct {
	databaseURL string
	queue       string
	logLevel    string
	json        bool
}

func (c *common) register(f *cli.FlagSet, urlUsage string) {
	f.StringVar(&c.databaseURL, "database-url", "", "URL", urlUsage, nil)
	f.StringVar(&c.queue, "queue", "demo", "NAME", "queue to work on", func(s string) error {
		if s == "" {
			return errors.New("must not be empty")
		}
		return nil
	})
	f.StringVar(&c.logLevel, "log-level", "warn", "LEVEL", "log level of the library's logs on stderr: debug, info, warn or error", checkLevel)
	f.BoolVar(&c.json, "json", false, "print the result as one JSON object on one line")
}

const urlRequired = cli.URLUsage

// requireURL reports a missing --database-url.
func (c *common) requireURL(f *cli.FlagSet) error { return f.RequireURL(c.databaseURL) }

func checkLevel(s string) error {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return nil
	}
	return errors.New("must be debug, info, warn or error")
}
