package partition

import (
	"bytes"
	"slices"

	"github.com/google/uuid"
)

// Assign returns, for each session, the parts it should own: contiguous runs
// in the lexical order of session ids, sizes differing by at most one.
//
// The sessions are sorted by id (byte order, which is also the order of their
// canonical strings) and deduplicated in a copy; the caller's slice is left
// untouched, and the result depends only on the set of ids. With k distinct
// sessions and n parts, the first n%k sessions get n/k+1 parts and the rest
// n/k; the first session gets the lowest run, the next one the run after it,
// and so on. When there are more sessions than parts, the last k-n sessions
// get an empty, non-nil slice. Each slice is in ascending order.
//
// If numParts <= 0 or there are no sessions, Assign returns an empty map.
func Assign(sessions []uuid.UUID, numParts int) map[uuid.UUID][]int {
	live := sortedUnique(sessions)
	out := make(map[uuid.UUID][]int, len(live))
	if numParts <= 0 || len(live) == 0 {
		return out
	}
	next := 0
	for i, s := range live {
		size := quota(i, len(live), numParts)
		parts := make([]int, size)
		for j := range parts {
			parts[j] = next + j
		}
		next += size
		out[s] = parts
	}
	return out
}

// Owner returns the session that Assign(sessions, numParts) gives part to,
// without building the whole assignment. It reports false if there are no
// sessions or part is not in [0, numParts).
func Owner(sessions []uuid.UUID, numParts, part int) (uuid.UUID, bool) {
	live := sortedUnique(sessions)
	if len(live) == 0 || part < 0 || part >= numParts {
		return uuid.UUID{}, false
	}
	k := len(live)
	q, r := numParts/k, numParts%k
	// The first r sessions hold q+1 parts each, covering [0, r*(q+1)); the
	// others hold q each (q > 0 there, since q == 0 implies r == numParts).
	big := r * (q + 1)
	if part < big {
		return live[part/(q+1)], true
	}
	return live[r+(part-big)/q], true
}

// AssignSticky is like Assign but moves fewer parts when sessions join or
// leave: it starts from prev, the current owners of the parts, and keeps
// every part with its owner as far as balance allows.
//
// Each live session's quota is the same as in Assign (in lexical order of
// session ids, the first numParts%k sessions get numParts/k+1 parts, the
// others numParts/k), so sizes differ by at most one. A live session keeps
// its previous parts up to its quota, the lowest-numbered ones, dropping the
// highest first. The parts nobody kept (dropped ones, those of sessions no
// longer live, those never owned) then go, lowest part first, to the
// sessions still under quota, in lexical order. Parts need not be
// contiguous.
//
// prev may name sessions that are not live (ignored) and parts outside
// [0, numParts) (ignored); if it lists a part under more than one live
// session, the lexically first keeps it. Neither prev nor sessions is
// modified. The result depends only on the set of live sessions, numParts
// and the sets of parts in prev, so every session computes the same answer
// from the same database state. With a nil prev it equals Assign.
//
// Each slice of the result is in ascending order. If numParts <= 0 or there
// are no sessions, AssignSticky returns an empty map.
func AssignSticky(prev map[uuid.UUID][]int, sessions []uuid.UUID, numParts int) map[uuid.UUID][]int {
	live := sortedUnique(sessions)
	out := make(map[uuid.UUID][]int, len(live))
	if numParts <= 0 || len(live) == 0 {
		return out
	}
	taken := make([]bool, numParts)
	for i, s := range live {
		want := quota(i, len(live), numParts)
		kept := make([]int, 0, want)
		old := slices.Clone(prev[s])
		slices.Sort(old)
		for _, p := range old {
			if len(kept) == want {
				break
			}
			if p < 0 || p >= numParts || taken[p] {
				continue
			}
			taken[p] = true
			kept = append(kept, p)
		}
		out[s] = kept
	}
	free := 0
	for i, s := range live {
		want := quota(i, len(live), numParts)
		parts := out[s]
		if len(parts) == want {
			continue
		}
		for len(parts) < want {
			for taken[free] {
				free++
			}
			taken[free] = true
			parts = append(parts, free)
		}
		slices.Sort(parts)
		out[s] = parts
	}
	return out
}

// Moved counts the parts that change owner from before to after: those that
// after gives to a session other than their owner in before, including parts
// nobody owned in before. Parts that after leaves unowned are not counted,
// since nothing is handed to anyone. Each part is expected to appear at most
// once in each map.
func Moved(before, after map[uuid.UUID][]int) int {
	owner := make(map[int]uuid.UUID)
	for s, parts := range before {
		for _, p := range parts {
			owner[p] = s
		}
	}
	moved := 0
	for s, parts := range after {
		for _, p := range parts {
			if o, ok := owner[p]; !ok || o != s {
				moved++
			}
		}
	}
	return moved
}

// quota returns how many parts the session at lexical rank i of k sessions
// owns out of n: the first n%k get n/k+1, the others n/k.
func quota(i, k, n int) int {
	if i < n%k {
		return n/k + 1
	}
	return n / k
}

// sortedUnique returns a sorted copy of ids without duplicates.
func sortedUnique(ids []uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return slices.Compact(out)
}
