package workertest

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// MaxListed is the most items of a queue that RequireEnqueued and its
// variants read: they are for the queues of tests. A queue holding more
// fails the assertion.
const MaxListed = 1000

// requireTimeout bounds the read of a queue's items.
const requireTimeout = time.Minute

// shownItems is how many of the queue's items a failure message lists.
const shownItems = 20

// A Match is one condition on an item, for RequireEnqueued,
// RequireEnqueuedN and RequireNotEnqueued: HasPayload, HasJSON, HasKey,
// HasTenant, HasPriority, or any condition with Where.
type Match struct {
	what string
	// test reports whether the item matches, and if not, what it has
	// instead ("": nothing to show).
	test func(it claim.Item) (ok bool, got string)
	err  error
}

// String describes the condition, as failure messages show it.
func (m Match) String() string { return m.what }

// HasPayload matches an item whose payload is p, byte for byte.
func HasPayload(p []byte) Match {
	return Match{what: "payload " + showBytes(p), test: func(it claim.Item) (bool, string) {
		return bytes.Equal(it.Payload, p), "payload " + showBytes(it.Payload)
	}}
}

// HasJSON matches an item whose payload is JSON equal to v: both are
// decoded and compared as values, so the order of object keys, spacing and
// the spelling of numbers do not matter. A json.RawMessage or []byte v is
// taken as JSON text; any other v is encoded with encoding/json first (so
// a struct is compared through its json tags, and a string is a JSON
// string, not JSON text).
func HasJSON(v any) Match {
	var text []byte
	var err error
	switch v := v.(type) {
	case json.RawMessage:
		text = v
	case []byte:
		text = v
	default:
		text, err = json.Marshal(v)
	}
	var want any
	if err == nil {
		want, err = decodeJSON(text)
	}
	m := Match{what: "JSON payload " + showBytes(text)}
	if err != nil {
		m.err = fmt.Errorf("HasJSON: the wanted value %s is not JSON: %w", showWant(v), err)
		return m
	}
	m.test = func(it claim.Item) (bool, string) {
		got, err := decodeJSON(it.Payload)
		if err != nil {
			return false, "payload " + showBytes(it.Payload) + " (not JSON)"
		}
		return reflect.DeepEqual(got, want), "payload " + showBytes(it.Payload)
	}
	return m
}

// showWant shows HasJSON's argument.
func showWant(v any) string {
	switch v := v.(type) {
	case json.RawMessage:
		return showBytes(v)
	case []byte:
		return showBytes(v)
	}
	return fmt.Sprintf("%#v", v)
}

// decodeJSON decodes one JSON value, with its numbers in a canonical
// spelling (normalizeNumbers).
func decodeJSON(text []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("more than one JSON value")
	}
	return normalizeNumbers(v), nil
}

// normalizeNumbers rewrites json.Numbers so that equal numbers compare
// equal however they are spelled (1, 1.0, 1e0).
func normalizeNumbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return strconv.FormatInt(i, 10)
		}
		if f, err := strconv.ParseFloat(string(v), 64); err == nil {
			if f >= -1<<53 && f <= 1<<53 && f == float64(int64(f)) {
				return strconv.FormatInt(int64(f), 10)
			}
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
		return string(v)
	case []any:
		for i := range v {
			v[i] = normalizeNumbers(v[i])
		}
	case map[string]any:
		for k := range v {
			v[k] = normalizeNumbers(v[k])
		}
	}
	return v
}

// HasKey matches an item whose key is key ("": an item without a key).
func HasKey(key string) Match {
	return Match{what: "key " + strconv.Quote(key), test: func(it claim.Item) (bool, string) {
		return it.Key == key, "key " + strconv.Quote(it.Key)
	}}
}

// HasTenant matches an item whose tenant is tenant ("": an item without a
// tenant).
func HasTenant(tenant string) Match {
	return Match{what: "tenant " + strconv.Quote(tenant), test: func(it claim.Item) (bool, string) {
		return it.Tenant == tenant, "tenant " + strconv.Quote(it.Tenant)
	}}
}

// HasPriority matches an item whose priority is p.
func HasPriority(p int) Match {
	return Match{what: "priority " + strconv.Itoa(p), test: func(it claim.Item) (bool, string) {
		return it.Priority == p, "priority " + strconv.Itoa(it.Priority)
	}}
}

// Where matches an item for which f returns true; what describes the
// condition in failure messages ("max attempts 3", "metadata set").
func Where(what string, f func(it claim.Item) bool) Match {
	return Match{what: what, test: func(it claim.Item) (bool, string) {
		return f(it), ""
	}}
}

// RequireEnqueued asserts that exactly one item in queue matches every one
// of matches, and returns it. Otherwise it fails the test with t.Fatalf,
// listing the queue's items and, for each, the conditions it missed.
//
// It reads the items that are in the queue now: waiting, delayed, claimed,
// or waiting for a retry. Items that were acked, cancelled or moved to the
// dead items are gone and do not count. db may be a pool, a connection, or
// the transaction the code under test enqueued in (to see its items before
// it commits); tables are the tables the code under test writes to (see
// Tables). In the returned item, Attempt is the number of claims so far
// (0: never claimed) and Session and Token are set if it is claimed.
// With no matches, it asserts that the queue holds exactly one item.
func RequireEnqueued(t testing.TB, db crsql.DB, tables crsql.Tables, queue string, matches ...Match) claim.Item {
	t.Helper()
	found := requireN(t, "RequireEnqueued", db, tables, queue, 1, matches)
	if len(found) != 1 {
		return claim.Item{} // t.Fatalf returned: a stand-in testing.TB
	}
	return found[0]
}

// RequireEnqueuedN is RequireEnqueued for exactly n matching items (n may be
// 0); it returns them, waiting items first in claim order (priority, then
// turn), then claimed items by the end of their lease. With no matches, it
// asserts that the queue holds exactly n items.
func RequireEnqueuedN(t testing.TB, db crsql.DB, tables crsql.Tables, queue string, n int, matches ...Match) []claim.Item {
	t.Helper()
	if n < 0 {
		t.Fatalf("workertest.RequireEnqueuedN: n = %d is negative", n)
	}
	return requireN(t, "RequireEnqueuedN", db, tables, queue, n, matches)
}

// RequireNotEnqueued asserts that no item in queue matches every one of
// matches (with no matches: that the queue is empty), as
// RequireEnqueuedN(t, db, tables, queue, 0, matches...) does.
func RequireNotEnqueued(t testing.TB, db crsql.DB, tables crsql.Tables, queue string, matches ...Match) {
	t.Helper()
	requireN(t, "RequireNotEnqueued", db, tables, queue, 0, matches)
}

// requireN reads queue's items and fails t unless exactly n match.
func requireN(t testing.TB, fn string, db crsql.DB, tables crsql.Tables, queue string, n int, matches []Match) []claim.Item {
	t.Helper()
	if db == nil {
		t.Fatalf("workertest.%s: nil database", fn)
	}
	for _, m := range matches {
		if m.err != nil {
			t.Fatalf("workertest.%s: %v", fn, m.err)
		}
		if m.test == nil {
			t.Fatalf("workertest.%s: a zero Match (make them with HasPayload, HasJSON, HasKey, HasTenant, HasPriority or Where)", fn)
		}
	}
	items, err := listItems(db, tables, queue)
	if err != nil {
		t.Fatalf("workertest.%s: %v", fn, err)
	}
	var found []claim.Item
	misses := make([][]string, len(items))
	for i, it := range items {
		for _, m := range matches {
			if ok, got := m.test(it); ok {
				continue
			} else if got == "" {
				misses[i] = append(misses[i], "not "+m.what)
			} else {
				misses[i] = append(misses[i], got+" (want "+m.what+")")
			}
		}
		if len(misses[i]) == 0 {
			found = append(found, it)
		}
	}
	if len(found) == n {
		return found
	}
	t.Fatalf("workertest.%s: %s", fn, failure(tables, queue, n, matches, items, misses, len(found)))
	return nil
}

// failure says what was wanted and lists what the queue holds.
func failure(tables crsql.Tables, queue string, n int, matches []Match, items []claim.Item, misses [][]string, found int) string {
	var b strings.Builder
	plural := "s"
	if n == 1 {
		plural = ""
	}
	fmt.Fprintf(&b, "want %d item%s of queue %q", n, plural, queue)
	if tables.Schema != "" {
		fmt.Fprintf(&b, " (schema %s)", tables.Schema)
	}
	if len(matches) > 0 {
		what := make([]string, len(matches))
		for i, m := range matches {
			what[i] = m.what
		}
		b.WriteString(" with " + strings.Join(what, ", "))
	}
	if len(items) == 0 {
		b.WriteString("; found none: the queue is empty")
		return b.String()
	}
	fmt.Fprintf(&b, "; found %d among the queue's %d items", found, len(items))
	b.WriteString(":")
	for i, it := range items {
		if i == shownItems {
			fmt.Fprintf(&b, "\n  ... and %d more", len(items)-shownItems)
			break
		}
		fmt.Fprintf(&b, "\n  %s", describe(it))
		if len(misses[i]) == 0 {
			b.WriteString("\n      matches")
		} else {
			b.WriteString("\n      differs: " + strings.Join(misses[i], "; "))
		}
	}
	return b.String()
}

// describe shows an item on one line.
func describe(it claim.Item) string {
	state := "waiting"
	if it.Session != uuid.Nil {
		state = "claimed"
	}
	return fmt.Sprintf("%s %s: key %q, tenant %q, priority %d, attempts %d, payload %s",
		it.ID, state, it.Key, it.Tenant, it.Priority, it.Attempt, showBytes(it.Payload))
}

// showBytes shows a payload: as it is if it is a JSON object or array,
// quoted if it is other text, else in hex; at most 200 bytes of it.
func showBytes(p []byte) string {
	const most = 200
	if t := bytes.TrimSpace(p); len(p) <= most && len(t) > 0 && (t[0] == '{' || t[0] == '[') && json.Valid(p) && !bytes.ContainsAny(p, "\n\r") {
		return string(p)
	}
	cut := ""
	if len(p) > most {
		p, cut = p[:most], fmt.Sprintf("...(%d bytes)", len(p))
	}
	if utf8.Valid(p) {
		return strconv.Quote(string(p)) + cut
	}
	return "0x" + hex.EncodeToString(p) + cut
}

// listItems returns the items in queue (at most MaxListed; more is an
// error): waiting items first, in claim order (priority, then turn), then
// claimed items by the end of their lease. Attempt is the number of claims
// so far; Session and Token are set for a claimed item.
func listItems(db crsql.DB, tables crsql.Tables, queue string) ([]claim.Item, error) {
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), requireTimeout)
	defer cancel()
	rows, err := store.New(tables).SchemaQueueItems(ctx, db, queue, MaxListed+1)
	if err != nil {
		return nil, fmt.Errorf("reading queue %q: %w", queue, store.Classify(err))
	}
	var items []claim.Item
	for _, r := range rows {
		it := claim.Item{
			ID: r.ID, Queue: r.Queue, Part: r.Part, Priority: r.Priority, Attempt: r.Attempts, MaxAttempts: r.MaxAttempts,
			Payload: r.Payload, Metadata: r.Metadata, EnqueuedAt: r.EnqueuedAt, VestingAt: r.VestingAt,
			AtMostOnce: r.AtMostOnce, TurnAt: r.TurnAt,
		}
		if r.Key != nil {
			it.Key = *r.Key
		}
		if r.LastError != nil {
			it.LastError = *r.LastError
		}
		if r.Tenant != nil {
			it.Tenant = *r.Tenant
		}
		if r.ExpiresAt != nil {
			it.ExpiresAt = *r.ExpiresAt
		}
		if r.Claimed && r.Claim != nil {
			it.Session, it.Token, it.InPart = *r.Claim, r.Token, r.ClaimPart != nil
			if r.LeaseUntil != nil {
				it.LeaseUntil = *r.LeaseUntil
			}
		}
		items = append(items, it)
	}
	if len(items) > MaxListed {
		return nil, fmt.Errorf("queue %q holds more than %d items: RequireEnqueued is for the queues of tests", queue, MaxListed)
	}
	// The statement's two branches come in no set order: waiting items
	// first, in claim order, then claimed ones by lease end.
	sort.SliceStable(items, func(i, j int) bool {
		a, b := items[i], items[j]
		ac, bc := a.Session != uuid.Nil, b.Session != uuid.Nil
		switch {
		case ac != bc:
			return !ac
		case ac:
			if !a.LeaseUntil.Equal(b.LeaseUntil) {
				return a.LeaseUntil.Before(b.LeaseUntil)
			}
		default:
			if a.Priority != b.Priority {
				return a.Priority < b.Priority
			}
			if !a.TurnAt.Equal(b.TurnAt) {
				return a.TurnAt.Before(b.TurnAt)
			}
		}
		return bytes.Compare(a.ID[:], b.ID[:]) < 0
	})
	return items, nil
}
