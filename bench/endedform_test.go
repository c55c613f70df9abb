package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestEndedFormsRecordEveryEndedID drains items with each form of the
// ended record and checks, with statements of its own, that the form's
// record holds every acked id exactly once and finds each one by the
// lookup its readers would use (a: the primary key (queue, id); b, c: the
// ids' GIN index, ids @> ARRAY[id]), that ids it never saw are not found,
// and that form d records nothing. Then it runs the whole command small,
// whose drains, dedup checks and prunes check their own rows. No timing is
// asserted.
func TestEndedFormsRecordEveryEndedID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	url, _, stop, err := startServer(ctx, io.Discard, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	setup, err := newSetupPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	if err := setupCrdbwork(ctx, setup); err != nil {
		t.Fatal(err)
	}
	e, err := newEndedBench(ctx, url, setup)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close(context.WithoutCancel(ctx))
	const n, batch = 300, 64 // the last transaction is short: 300 = 4·64 + 44
	for _, f := range endedForms {
		if _, err := e.drain(ctx, f, n, batch, statements{}, false, io.Discard); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if len(e.acked) != n {
			t.Fatalf("%s: %d ids acked, want %d", f.name, len(e.acked), n)
		}
		table := f.table("drain")
		var recorded, distinct, found, rows int64
		switch {
		case f.key == "d":
			if err := setup.QueryRow(ctx, `SELECT count(*) FROM crdbwork_ended WHERE queue = $1`, endedFormQueue).Scan(&recorded); err != nil {
				t.Fatal(err)
			}
			if recorded != 0 {
				t.Errorf("%s: %d ids recorded, want none", f.name, recorded)
			}
			continue
		case f.gin:
			err = setup.QueryRow(ctx, `SELECT count(*), count(DISTINCT x), (SELECT count(*) FROM `+table+` WHERE queue = $1)
FROM `+table+`, unnest(ids) AS x WHERE queue = $1`, endedFormQueue).Scan(&recorded, &distinct, &rows)
			if err == nil {
				err = setup.QueryRow(ctx, `SELECT count(*) FROM unnest($2::UUID[]) AS v (id)
WHERE EXISTS (SELECT 1 FROM `+table+` AS e WHERE e.ids @> ARRAY[v.id] AND e.queue = $1)`, endedFormQueue, e.acked).Scan(&found)
			}
			if want := int64((n + batch - 1) / batch); err == nil && rows != want {
				t.Errorf("%s: %d rows, want one per transaction: %d", f.name, rows, want)
			}
		default:
			err = setup.QueryRow(ctx, `SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE id = ANY($2::UUID[]))
FROM crdbwork_ended WHERE queue = $1`, endedFormQueue, e.acked).Scan(&recorded, &distinct, &found)
		}
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if recorded != n || distinct != n || found != n {
			t.Errorf("%s: %d ids recorded (%d distinct), %d of the %d acked ids found", f.name, recorded, distinct, found, n)
		}
		// The form's dedup check lets through only ids it never recorded.
		fresh := make([][16]byte, 50)
		for i := range fresh {
			fresh[i] = [16]byte{0xfe, byte(i), 1}
		}
		if missed, err := f.notFound(ctx, setup, table, endedFormQueue, e.acked); err != nil || missed != 0 {
			t.Errorf("%s: the dedup check misses %d acked ids (%v)", f.name, missed, err)
		}
		if through, err := f.notFound(ctx, setup, table, endedFormQueue, fresh); err != nil || through != int64(len(fresh)) {
			t.Errorf("%s: the dedup check lets %d of %d new ids through, want all (%v)", f.name, through, len(fresh), err)
		}
	}

	var out strings.Builder
	args := []string{"endedform", "--items", "400", "--batches", "64,250", "--rounds", "2", "--record", "5000",
		"--pending", "1000", "--check-batch", "10", "--checks", "5", "--prune", "600"}
	if err := run(ctx, args, &out); err != nil {
		t.Fatalf("%q: %v\n%s", args, err, out.String())
	}
	for _, want := range []string{"| a: per-item rows (today)", "| d: no record (floor)", "form c after gin_clean_pending_list", "| c: per-tx row, GIN fastupdate on, 250 ids a row", "| a: per-item rows, no row locks"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output has no %q:\n%s", want, out.String())
		}
	}
	// The drains alone, without the readers' record (its sizes then unchecked).
	if err := run(ctx, []string{"endedform", "--items", "100", "--batches", "64", "--rounds", "1", "--record", "0"}, io.Discard); err != nil {
		t.Errorf("the drains alone: %v", err)
	}
	for _, args := range [][]string{{"endedform", "--forms", "x"}, {"endedform", "--items", "0", "--record", "0"}, {"endedform", "--batches", "0"}, {"endedform", "--prune", "150000"}, {"endedform", "extra"}} {
		if err := run(ctx, args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
