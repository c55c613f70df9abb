package partition

import (
	"slices"
	"testing"

	"github.com/google/uuid"
)

// TestDivideLeavesOldSessionsTheirParts checks the division of a rolling
// upgrade: members that did not join (code older than queue membership)
// keep exactly the parts they hold, every other part is targeted by exactly
// one joined member, and without such members the strategy's own division
// is returned.
func TestDivideLeavesOldSessionsTheirParts(t *testing.T) {
	t.Parallel()
	ids := make([]uuid.UUID, 4)
	for i := range ids {
		ids[i] = uuid.New()
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	old1, old2, new1, new2 := ids[0], ids[1], ids[2], ids[3]
	const n = 16
	for _, strategy := range []Strategy{Contiguous, Sticky} {
		// old1 holds 3 parts, old2 none yet, new1 holds 2 that old1's
		// neighbours would want under an even division of 4.
		prev := map[uuid.UUID][]int{old1: {0, 5, 9}, new1: {1, 2}}
		live := []uuid.UUID{old1, new1, new2} // old2 owns nothing: not a member
		joined := []uuid.UUID{new1, new2}
		got := divide(strategy, prev, live, joined, n)
		if !slices.Equal(got[old1], []int{0, 5, 9}) {
			t.Fatalf("old session's target = %v, want exactly the parts it holds [0 5 9]", got[old1])
		}
		if len(got[old2]) != 0 {
			t.Fatalf("a session that is not a member got parts %v", got[old2])
		}
		seen := map[int]uuid.UUID{}
		for s, ps := range got {
			for _, p := range ps {
				if o, dup := seen[p]; dup {
					t.Fatalf("part %d targeted by %v and %v", p, o, s)
				}
				seen[p] = s
			}
		}
		if len(seen) != n {
			t.Fatalf("%d of %d parts targeted: %v", len(seen), n, got)
		}
		if d := len(got[new1]) - len(got[new2]); d < -1 || d > 1 {
			t.Fatalf("joined members unbalanced: %v and %v", got[new1], got[new2])
		}
		// Without old sessions the strategy decides alone.
		plain := divide(strategy, map[uuid.UUID][]int{new1: {1, 2}}, joined, joined, n)
		want := strategy(map[uuid.UUID][]int{new1: {1, 2}}, joined, n)
		for _, s := range joined {
			if !slices.Equal(plain[s], want[s]) {
				t.Fatalf("without old sessions: %v, want the strategy's %v", plain, want)
			}
		}
	}
}
