package claim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// tenantsOfPart returns n tenant names, with prefix, whose items land in part
// (claim.PartOf) of parts.
func tenantsOfPart(prefix string, part, parts, n int) []string {
	var names []string
	for i := 0; len(names) < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if claim.PartOf("", name, parts) == part {
			names = append(names, name)
		}
	}
	return names
}

// In parts mode (4 parts, 2 sessions each claiming in its own parts), a
// fair queue serves a small tenant within one round of its
// part: its item is claimed among the next (tenants backlogged in the part)
// claims of that part, whether it came before the claims began or while
// they went on; in a plain queue it waits behind the part's backlog.
func TestFairPartsServeSmallTenantsWithinARound(t *testing.T) {
	t.Parallel()
	const parts, bigPerPart, bigItems, smallPerPart = 4, 2, 100, 3
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprint("fair=", fair), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			if _, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
				t.Fatal(err)
			}
			q := newQueue(t, pool, claim.Options{})
			if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: fair}}); err != nil {
				t.Fatal(err)
			}
			// Two big tenants in every part, each enqueueing its backlog in
			// two calls.
			for p := range parts {
				for _, tn := range tenantsOfPart(fmt.Sprint("big-p", p), p, parts, bigPerPart) {
					for range 2 {
						items := make([]claim.NewItem, bigItems/2)
						for i := range items {
							items[i] = claim.NewItem{Payload: []byte("big"), Tenant: tn}
						}
						if _, err := q.Enqueue(ctx, items...); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			// enqueueSmall enqueues one item for each of smallPerPart new
			// tenants of every part, one call each, and notes them in small.
			small := map[string]bool{}
			enqueueSmall := func(wave string) {
				for p := range parts {
					for _, tn := range tenantsOfPart(wave+"-p"+fmt.Sprint(p), p, parts, smallPerPart) {
						if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("small"), Tenant: tn}); err != nil {
							t.Fatal(err)
						}
						small[tn] = true
					}
				}
			}
			enqueueSmall("early")

			// Session A owns parts 0 and 1, session B parts 2 and 3.
			a, b := startSession(t, ctx, pool), startSession(t, ctx, pool)
			sessions := []struct {
				id    uuid.UUID
				parts []int
			}{{a.ID(), []int{0, 1}}, {b.ID(), []int{2, 3}}}
			for _, s := range sessions {
				for _, p := range s.parts {
					if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, s.id, q.Name(), p); err != nil {
						t.Fatal(err)
					}
				}
			}
			// seq[p] lists the tenants of part p's claims, in claim order,
			// and turns[p] their turns.
			seq := make([][]string, parts)
			turns := make([][]time.Time, parts)
			// round has each session claim up to 4 items of its parts and
			// ack them.
			round := func() {
				for _, s := range sessions {
					got, err := q.Claimer(s.id).Claim(ctx, claim.ClaimRequest{Max: 4, Parts: s.parts})
					if err != nil {
						t.Fatal(err)
					}
					for _, it := range got {
						seq[it.Part] = append(seq[it.Part], it.Tenant)
						turns[it.Part] = append(turns[it.Part], it.TurnAt)
						if err := q.Ack(ctx, it, nil); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			// within returns the tenants of wave in part p not served in
			// the part's claims [from, from+n). (A plain queue: each
			// tenant's items sit in the tenant's part.)
			within := func(p, from, n int, wave map[string]bool) []string {
				served := map[string]bool{}
				for i := from; i < min(from+n, len(seq[p])); i++ {
					served[seq[p][i]] = true
				}
				var missing []string
				for tn := range wave {
					if claim.PartOf("", tn, parts) == p && !served[tn] {
						missing = append(missing, tn)
					}
				}
				return missing
			}
			// firstRound returns the tenants of wave not served in the first
			// round of their part from mark on. (A fair queue spreads each
			// tenant's items over the parts by turn: a small tenant's item is
			// in the first round of its part if it entered at the head, no
			// later than the first big item claimed from mark on, and no
			// item of its part with a later turn was claimed before it.)
			firstRound := func(mark []int, wave map[string]bool) []string {
				var head time.Time
				for p := range parts {
					for i := mark[p]; i < len(seq[p]); i++ {
						if !wave[seq[p][i]] && (head.IsZero() || turns[p][i].Before(head)) {
							head = turns[p][i]
						}
					}
				}
				var missing []string
				for tn := range wave {
					served := false
					for p := range parts {
						for i := mark[p]; i < len(seq[p]); i++ {
							if seq[p][i] != tn {
								continue
							}
							served = !turns[p][i].After(head)
							for j := mark[p]; j < i; j++ {
								served = served && !turns[p][j].After(turns[p][i])
							}
						}
					}
					if !served {
						missing = append(missing, tn)
					}
				}
				return missing
			}
			for range 10 {
				round()
			}
			// The early small tenants: within the first round of their part
			// (its big tenants' first items and the smalls themselves).
			early := small
			if fair {
				if missing := firstRound(make([]int, parts), early); len(missing) > 0 {
					t.Errorf("fair: small tenants %v not served in their parts' first round", missing)
				}
			}
			for p := range parts {
				if fair {
					break
				}
				missing := within(p, 0, bigPerPart+smallPerPart, early)
				if !fair && len(missing) != smallPerPart {
					t.Errorf("plain: part %d: %d small tenants of %d jumped the backlog", p, smallPerPart-len(missing), smallPerPart)
				}
			}
			// A second wave while the claims go on.
			mark := make([]int, parts)
			for p := range parts {
				mark[p] = len(seq[p])
			}
			small = map[string]bool{}
			enqueueSmall("late")
			for range 10 {
				round()
			}
			if fair {
				if missing := firstRound(mark, small); len(missing) > 0 {
					t.Errorf("fair: late small tenants %v not served in their parts' next round", missing)
				}
			}
			for p := range parts {
				if fair {
					break
				}
				missing := within(p, mark[p], bigPerPart+smallPerPart, small)
				if !fair && len(missing) != smallPerPart {
					t.Errorf("plain: part %d: %d late small tenants of %d jumped the backlog", p, smallPerPart-len(missing), smallPerPart)
				}
			}
		})
	}
}
