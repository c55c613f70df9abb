package partition_test

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/partition"
)

// randID returns a random UUID drawn from rng, so that failures replay.
func randID(rng *rand.Rand) uuid.UUID {
	var u uuid.UUID
	for i := range u {
		u[i] = byte(rng.IntN(256))
	}
	return u
}

func randIDs(rng *rand.Rand, k int) []uuid.UUID {
	ids := make([]uuid.UUID, k)
	for i := range ids {
		ids[i] = randID(rng)
	}
	return ids
}

// lexical returns the distinct ids sorted by their canonical strings: an
// order computed independently of the package's byte comparison.
func lexical(ids []uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// withDuplicatesShuffled returns ids with some entries repeated, shuffled.
func withDuplicatesShuffled(rng *rand.Rand, ids []uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	for range rng.IntN(len(ids) + 1) {
		out = append(out, ids[rng.IntN(len(ids))])
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func equal(a, b map[uuid.UUID][]int) bool {
	return maps.EqualFunc(a, b, func(x, y []int) bool { return slices.Equal(x, y) })
}

// checkBalanced checks the properties both strategies share: exactly the
// live sessions are keys, every part in [0, n) is owned exactly once, every
// slice is sorted and non-nil, and the session at lexical rank i owns
// n/k+1 parts if i < n%k and n/k otherwise (so sizes differ by at most one).
func checkBalanced(t *testing.T, name string, live []uuid.UUID, n int, got map[uuid.UUID][]int) {
	t.Helper()
	sorted := lexical(live)
	if n <= 0 || len(sorted) == 0 {
		if got == nil || len(got) != 0 {
			t.Fatalf("%s(k=%d, n=%d) = %v, want an empty map", name, len(sorted), n, got)
		}
		return
	}
	if len(got) != len(sorted) {
		t.Fatalf("%s(k=%d, n=%d): %d sessions in the result, want %d", name, len(sorted), n, len(got), len(sorted))
	}
	seen := make([]int, n)
	minSize, maxSize := n+1, -1
	k := len(sorted)
	for i, s := range sorted {
		parts, ok := got[s]
		if !ok || parts == nil {
			t.Fatalf("%s(k=%d, n=%d): session %v missing or nil", name, k, n, s)
		}
		if !slices.IsSorted(parts) {
			t.Fatalf("%s(k=%d, n=%d): parts of %v not sorted: %v", name, k, n, s, parts)
		}
		want := n / k
		if i < n%k {
			want++
		}
		if len(parts) != want {
			t.Fatalf("%s(k=%d, n=%d): session of rank %d owns %d parts, want %d", name, k, n, i, len(parts), want)
		}
		minSize, maxSize = min(minSize, len(parts)), max(maxSize, len(parts))
		for _, p := range parts {
			if p < 0 || p >= n {
				t.Fatalf("%s(k=%d, n=%d): part %d out of range", name, k, n, p)
			}
			seen[p]++
		}
	}
	if maxSize-minSize > 1 {
		t.Fatalf("%s(k=%d, n=%d): sizes range from %d to %d", name, k, n, minSize, maxSize)
	}
	for p, c := range seen {
		if c != 1 {
			t.Fatalf("%s(k=%d, n=%d): part %d owned %d times", name, k, n, p, c)
		}
	}
}

// randCase draws a number of sessions and of parts, covering k > n, n == 0
// and k == 0 now and then.
func randCase(rng *rand.Rand) (k, n int) {
	k = rng.IntN(40)
	n = rng.IntN(150) - 5
	return k, n
}

func TestAssignProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		k, n := randCase(rng)
		live := randIDs(rng, k)
		in := live
		if k > 0 {
			in = withDuplicatesShuffled(rng, live)
		}
		saved := slices.Clone(in)
		got := partition.Assign(in, n)
		if !slices.Equal(in, saved) {
			t.Fatalf("Assign modified its input")
		}
		checkBalanced(t, "Assign", live, n, got)
		if n <= 0 || k == 0 {
			continue
		}

		// Contiguous runs, in lexical order of session ids.
		var concat []int
		for _, s := range lexical(live) {
			concat = append(concat, got[s]...)
		}
		for i, p := range concat {
			if p != i {
				t.Fatalf("Assign(k=%d, n=%d): runs in lexical order are %v, want 0..%d", k, n, concat, n-1)
			}
		}

		// Deterministic under permutation and duplication of the input.
		again := partition.Assign(withDuplicatesShuffled(rng, live), n)
		if !equal(got, again) {
			t.Fatalf("Assign(k=%d, n=%d) depends on the input order: %v vs %v", k, n, got, again)
		}

		// Owner agrees with Assign.
		for s, parts := range got {
			for _, p := range parts {
				if o, ok := partition.Owner(in, n, p); !ok || o != s {
					t.Fatalf("Owner(k=%d, n=%d, %d) = %v, %v; want %v", k, n, p, o, ok, s)
				}
			}
		}
		for _, p := range []int{-1, n, n + 7} {
			if _, ok := partition.Owner(in, n, p); ok {
				t.Fatalf("Owner(k=%d, n=%d, %d) reported an owner", k, n, p)
			}
		}
	}
}

func TestOwnerNoSessions(t *testing.T) {
	t.Parallel()
	if _, ok := partition.Owner(nil, 8, 0); ok {
		t.Fatal("Owner with no sessions reported an owner")
	}
}

// TestLexicalOrderIsStringOrder pins that ids are ordered as their
// canonical strings, the order a database returns for ORDER BY id.
func TestLexicalOrderIsStringOrder(t *testing.T) {
	t.Parallel()
	a := uuid.MustParse("0fffffff-ffff-ffff-ffff-ffffffffffff")
	b := uuid.MustParse("a0000000-0000-0000-0000-000000000000")
	c := uuid.MustParse("a0000000-0000-0000-0000-000000000001")
	got := partition.Assign([]uuid.UUID{c, b, a}, 3)
	want := map[uuid.UUID][]int{a: {0}, b: {1}, c: {2}}
	if !equal(got, want) {
		t.Fatalf("Assign = %v, want %v", got, want)
	}
	if bytes.Compare(a[:], b[:]) >= 0 {
		t.Fatal("test ids not in byte order")
	}
}

// randPrev returns a plausible previous assignment for n parts: the result
// of a strategy over a set that shares some sessions with live, or, now and
// then, garbage (dead sessions, out-of-range and doubly owned parts).
func randPrev(rng *rand.Rand, live []uuid.UUID, n int) map[uuid.UUID][]int {
	var old []uuid.UUID
	for _, s := range live {
		if rng.IntN(4) > 0 {
			old = append(old, s)
		}
	}
	old = append(old, randIDs(rng, rng.IntN(4))...)
	switch rng.IntN(4) {
	case 0:
		return partition.Assign(old, n)
	case 1:
		return partition.AssignSticky(partition.Assign(randIDs(rng, rng.IntN(10)), n), old, n)
	case 2:
		return nil
	default:
		prev := map[uuid.UUID][]int{}
		for _, s := range old {
			parts := make([]int, rng.IntN(10))
			for i := range parts {
				parts[i] = rng.IntN(n+10) - 5
			}
			prev[s] = parts
		}
		return prev
	}
}

// wellFormed reports whether prev gives each part at most once, all in range.
func wellFormed(prev map[uuid.UUID][]int, n int) bool {
	seen := map[int]bool{}
	for _, parts := range prev {
		for _, p := range parts {
			if p < 0 || p >= n || seen[p] {
				return false
			}
			seen[p] = true
		}
	}
	return true
}

func clonePrev(prev map[uuid.UUID][]int) map[uuid.UUID][]int {
	if prev == nil {
		return nil
	}
	out := make(map[uuid.UUID][]int, len(prev))
	for s, parts := range prev {
		out[s] = slices.Clone(parts)
	}
	return out
}

func TestAssignStickyProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		k, n := randCase(rng)
		live := randIDs(rng, k)
		prev := randPrev(rng, live, max(n, 1))
		in := live
		if k > 0 {
			in = withDuplicatesShuffled(rng, live)
		}
		savedIn, savedPrev := slices.Clone(in), clonePrev(prev)
		got := partition.AssignSticky(prev, in, n)
		if !slices.Equal(in, savedIn) || !equal(prev, savedPrev) {
			t.Fatalf("AssignSticky modified its input")
		}
		checkBalanced(t, "AssignSticky", live, n, got)
		if n <= 0 || k == 0 {
			continue
		}

		// Deterministic under permutation of the sessions and of each
		// session's previous parts.
		shuffled := clonePrev(prev)
		for _, parts := range shuffled {
			rng.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
		}
		again := partition.AssignSticky(shuffled, withDuplicatesShuffled(rng, live), n)
		if !equal(got, again) {
			t.Fatalf("AssignSticky(k=%d, n=%d) depends on the input order: %v vs %v", k, n, got, again)
		}

		// With nothing owned before, it is Assign.
		if prev == nil && !equal(got, partition.Assign(live, n)) {
			t.Fatalf("AssignSticky(nil, k=%d, n=%d) = %v, want Assign's %v", k, n, got, partition.Assign(live, n))
		}

		// Sticky: from a well-formed prev, each live session keeps its
		// lowest previous parts, as many as its quota allows.
		if !wellFormed(prev, n) {
			continue
		}
		for _, s := range live {
			old := slices.Sorted(slices.Values(prev[s]))
			keep := old[:min(len(old), len(got[s]))]
			for _, p := range keep {
				if !slices.Contains(got[s], p) {
					t.Fatalf("AssignSticky(k=%d, n=%d): %v lost part %d (had %v, now %v)", k, n, s, p, old, got[s])
				}
			}
		}
	}
}

func TestAssignStickyDropsHighestAndFillsLowest(t *testing.T) {
	t.Parallel()
	a := uuid.MustParse("10000000-0000-0000-0000-000000000000")
	b := uuid.MustParse("20000000-0000-0000-0000-000000000000")
	c := uuid.MustParse("30000000-0000-0000-0000-000000000000")
	gone := uuid.MustParse("40000000-0000-0000-0000-000000000000")
	prev := map[uuid.UUID][]int{
		a:    {7, 1, 3, 5, 6}, // over its quota of 3: drops 7 and 6
		gone: {0, 2},          // orphaned
		c:    {4},
	}
	// 8 parts over a, b, c: quotas 3, 3, 2.
	got := partition.AssignSticky(prev, []uuid.UUID{c, b, a}, 8)
	want := map[uuid.UUID][]int{
		a: {1, 3, 5},
		b: {0, 2, 6},
		c: {4, 7},
	}
	if !equal(got, want) {
		t.Fatalf("AssignSticky = %v, want %v", got, want)
	}
	if m := partition.Moved(prev, got); m != 4 {
		t.Fatalf("Moved = %d, want 4 (parts 0, 2, 6, 7)", m)
	}
}

func TestMoved(t *testing.T) {
	t.Parallel()
	a, b := uuid.New(), uuid.New()
	before := map[uuid.UUID][]int{a: {0, 1}, b: {2}}
	after := map[uuid.UUID][]int{a: {0}, b: {1, 2, 3}}
	// Part 1 moves a→b, part 3 was unowned.
	if m := partition.Moved(before, after); m != 2 {
		t.Fatalf("Moved = %d, want 2", m)
	}
	if m := partition.Moved(after, after); m != 0 {
		t.Fatalf("Moved(x, x) = %d, want 0", m)
	}
	if m := partition.Moved(nil, after); m != 4 {
		t.Fatalf("Moved(nil, after) = %d, want 4", m)
	}
	if m := partition.Moved(before, nil); m != 0 {
		t.Fatalf("Moved(before, nil) = %d, want 0", m)
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// TestMovement measures how many parts change owner when one session joins
// or leaves, for Assign and AssignSticky, over random trials; it logs the
// averages (go test -v) and checks that AssignSticky moves no more on
// average, and, per trial, only what the change forces: on a join, the
// newcomer's share (at most ceil(n/(k+1))); on a leave, the leaver's parts.
func TestMovement(t *testing.T) {
	t.Parallel()
	const (
		n      = 64
		trials = 200
		maxK   = 16
	)
	rng := rand.New(rand.NewPCG(5, 6))
	var table strings.Builder
	fmt.Fprintf(&table, "avg parts moved, %d parts, %d trials\n", n, trials)
	fmt.Fprintf(&table, "%3s  %12s %12s  %12s %12s\n", "k", "join plain", "join sticky", "leave plain", "leave sticky")
	for k := 1; k <= maxK; k++ {
		var joinPlain, joinSticky, leavePlain, leaveSticky int
		for range trials {
			live := randIDs(rng, k)
			// Bring the sticky state to k sessions through some churn, so
			// that its parts are no longer contiguous runs.
			sticky := partition.AssignSticky(nil, live, n)
			for range 5 {
				i := rng.IntN(len(live))
				live[i] = randID(rng)
				sticky = partition.AssignSticky(sticky, live, n)
			}
			plain := partition.Assign(live, n)

			// One session joins.
			joined := append(slices.Clone(live), randID(rng))
			jp := partition.Moved(plain, partition.Assign(joined, n))
			afterJoin := partition.AssignSticky(sticky, joined, n)
			js := partition.Moved(sticky, afterJoin)
			if newcomer := len(afterJoin[joined[k]]); js != newcomer {
				t.Errorf("k=%d join: sticky moved %d parts, want exactly the newcomer's %d", k, js, newcomer)
			}
			if limit := ceilDiv(n, k+1) + 1; js > limit {
				t.Errorf("k=%d join: sticky moved %d parts, more than %d", k, js, limit)
			}
			joinPlain += jp
			joinSticky += js

			// One session leaves.
			if k == 1 {
				continue // nobody is left to own anything
			}
			i := rng.IntN(k)
			leaver := live[i]
			left := slices.Delete(slices.Clone(live), i, i+1)
			lp := partition.Moved(plain, partition.Assign(left, n))
			ls := partition.Moved(sticky, partition.AssignSticky(sticky, left, n))
			if had := len(sticky[leaver]); ls != had {
				t.Errorf("k=%d leave: sticky moved %d parts, want exactly the leaver's %d", k, ls, had)
			}
			if limit := ceilDiv(n, k); ls > limit {
				t.Errorf("k=%d leave: sticky moved %d parts, more than %d", k, ls, limit)
			}
			leavePlain += lp
			leaveSticky += ls
		}
		if joinSticky > joinPlain {
			t.Errorf("k=%d join: sticky moved %d parts in all, plain %d", k, joinSticky, joinPlain)
		}
		if leaveSticky > leavePlain {
			t.Errorf("k=%d leave: sticky moved %d parts in all, plain %d", k, leaveSticky, leavePlain)
		}
		avg := func(sum int) float64 { return float64(sum) / trials }
		if k == 1 {
			fmt.Fprintf(&table, "%3d  %12.2f %12.2f  %12s %12s\n", k, avg(joinPlain), avg(joinSticky), "n/a", "n/a")
			continue
		}
		fmt.Fprintf(&table, "%3d  %12.2f %12.2f  %12.2f %12.2f\n", k, avg(joinPlain), avg(joinSticky), avg(leavePlain), avg(leaveSticky))
	}
	t.Log("\n" + table.String())
}

func BenchmarkAssign(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	live := randIDs(rng, 16)
	for b.Loop() {
		partition.Assign(live, 64)
	}
}

func BenchmarkAssignSticky(b *testing.B) {
	rng := rand.New(rand.NewPCG(9, 10))
	live := randIDs(rng, 16)
	prev := partition.Assign(live, 64)
	live[3] = randID(rng)
	for b.Loop() {
		partition.AssignSticky(prev, live, 64)
	}
}
