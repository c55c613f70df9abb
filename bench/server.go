package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/dbserver"
)

// serverMaxConns, if positive, is the max_connections of the throwaway
// server that startServer starts, for commands that run
// more connections than the tests' server allows (idle).
var serverMaxConns int

// startServer starts a throwaway PostgreSQL server with the library's
// internal/dbserver (the tests' server: fsync off, asynchronous commit). With
// statements, it preloads pg_stat_statements when the server has it (a
// restart). With durable, fsync, synchronous_commit and full_page_writes
// are on (dbserver.Options.Durable). It returns the URL, the postmaster's pid
// (0 if unknown) and the function that stops the server and removes its files.
func startServer(ctx context.Context, out io.Writer, statements, durable bool) (string, int, func(), error) {
	s, err := dbserver.Start(ctx, dbserver.Options{Prefer: dbserver.Postgres, Durable: durable, MaxConnections: serverMaxConns})
	if err != nil {
		return "", 0, nil, err
	}
	stop := func() {
		if err := s.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
	}
	url := s.URL("")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		stop()
		return "", 0, nil, err
	}
	defer func() { conn.Close(context.WithoutCancel(ctx)) }()
	if statements {
		var libdir string
		if err := conn.QueryRow(ctx, `SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'`).Scan(&libdir); err != nil {
			stop()
			return "", 0, nil, err
		}
		if _, err := os.Stat(filepath.Join(libdir, "pg_stat_statements.so")); err != nil {
			fmt.Fprintln(out, "pg_stat_statements is not installed: --statements will show nothing")
		} else {
			if _, err := conn.Exec(ctx, `ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'`); err != nil {
				stop()
				return "", 0, nil, err
			}
			conn.Close(ctx)
			if err := s.Restart(ctx); err != nil {
				stop()
				return "", 0, nil, fmt.Errorf("restarting PostgreSQL with pg_stat_statements: %w", err)
			}
			if conn, err = pgx.Connect(ctx, url); err != nil {
				stop()
				return "", 0, nil, err
			}
		}
	}
	// The postmaster is the parent of this connection's backend.
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		stop()
		return "", 0, nil, err
	}
	postmaster := 0
	if f := procStat(backend); f != nil {
		postmaster, _ = strconv.Atoi(f[3])
	}
	return url, postmaster, stop, nil
}
