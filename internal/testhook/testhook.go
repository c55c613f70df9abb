// Package testhook holds the switches that the test harness
// (internal/testdb) sets in its own process to make the library behave as
// it would on another engine. Library code reads them; nothing but the
// test harness sets them, so in a program they keep their zero values.
package testhook

import "sync/atomic"

var noListen atomic.Bool

// SetNoListen makes the wake-up listener (package internal/wake) treat
// every server as CockroachDB, which has no LISTEN: the listener stops at
// its first connection and the idle probe runs instead, as on CockroachDB.
// The test harness sets it in the CockroachDB fault mode
// (CRDBWORK_TEST_FAULTS=crdb).
func SetNoListen(on bool) { noListen.Store(on) }

// NoListen reports whether SetNoListen(true) is in force.
func NoListen() bool { return noListen.Load() }
