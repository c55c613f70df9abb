package testdb

import (
	"fmt"
	"strings"
)

// EnqueueParams are the parameters of the SQL function crdbwork_enqueue
// (sql/enqueue_function.sql), in order, each with the value a call by
// position passes for it when it is skipped: its default (none for the two
// required ones). Package sql's tests keep it equal to the function's
// declaration.
var EnqueueParams = []struct{ Name, Default string }{
	{"queue", ""}, {"payload", ""}, {"id", "NULL"}, {"key", "NULL"}, {"priority", "0"},
	{"delay", "NULL"}, {"run_at", "NULL"}, {"max_attempts", "NULL"}, {"tenant", "NULL"},
	{"ttl", "NULL"}, {"metadata", "NULL"}, {"headers", "NULL"}, {"at_most_once", "false"},
	{"timeout", "NULL"}, {"kind", "NULL"}, {"after", "NULL"}, {"run_after", "NULL"}, {"after_queues", "NULL"},
}

// EnqueueArgs returns the argument list of a call of crdbwork_enqueue by
// position: queue and payload (SQL expressions), then the arguments named
// in pairs (a parameter's name, then its SQL expression), each at its
// place, with the default of every parameter skipped before the last one
// named. CockroachDB takes no named arguments in calls
// (cockroachdb/cockroach#122264: `f(key => v)` is a syntax error there), so
// the tests call the function this way on both engines:
//
//	EnqueueArgs("'mail'", "''::BYTEA", "key", "'k1'", "delay", "INTERVAL '5 minutes'")
//	// 'mail', ''::BYTEA, NULL, 'k1', 0, INTERVAL '5 minutes'
//
// It panics on a name the function does not have, a name given twice, or
// an odd number of strings: a mistake of the test that calls it.
func EnqueueArgs(queue, payload string, named ...string) string {
	if len(named)%2 != 0 {
		panic("testdb.EnqueueArgs: named arguments come in pairs of name and value")
	}
	args := []string{queue, payload}
	set := map[int]bool{}
	last := 1
	for i := 0; i < len(named); i += 2 {
		at := -1
		for j, p := range EnqueueParams {
			if p.Name == named[i] && j >= 2 {
				at = j
			}
		}
		if at < 0 || set[at] {
			panic(fmt.Sprintf("testdb.EnqueueArgs: %q is not an optional parameter of crdbwork_enqueue, or is given twice", named[i]))
		}
		set[at] = true
		last = max(last, at)
	}
	for j := 2; j <= last; j++ {
		args = append(args, EnqueueParams[j].Default)
	}
	for i := 0; i < len(named); i += 2 {
		for j, p := range EnqueueParams {
			if p.Name == named[i] {
				args[j] = named[i+1]
			}
		}
	}
	return strings.Join(args, ", ")
}
