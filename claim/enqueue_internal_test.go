package claim

import (
	"slices"
	"testing"
)

// The chunk plan keeps every statement and COPY under chunkBytes and its row
// limit, keeps the items in order, and loses none.
func TestEnqueueChunkPlan(t *testing.T) {
	mib := make([]byte, 1<<20)
	for _, tc := range []struct {
		name    string
		items   []NewItem
		maxRows int
		want    int // chunks
	}{
		{"40 items of 1 MiB", repeatItem(NewItem{Payload: mib}, 40), insertRows, 6},
		{"20 items of 1 MiB + 1 MiB metadata", repeatItem(NewItem{Payload: mib, Metadata: mib}, 20), copyRows, 7},
		{"12001 small items", repeatItem(NewItem{Payload: []byte("x"), Key: "k"}, 12001), insertRows, 3},
		{"one item at the limits", []NewItem{{Payload: make([]byte, MaxPayloadLimit), Metadata: make([]byte, MaxPayloadLimit), Key: string(make([]byte, MaxKeyLength))}}, insertRows, 1},
		{"none", nil, insertRows, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := all(len(tc.items))
			plan := chunks(tc.items, idx, tc.maxRows)
			if len(plan) != tc.want {
				t.Errorf("%d chunks, want %d", len(plan), tc.want)
			}
			var flat []int
			for _, c := range plan {
				bytes := 0
				for _, i := range c {
					bytes += rowBytes(&tc.items[i])
				}
				if len(c) == 0 || len(c) > tc.maxRows || bytes > chunkBytes {
					t.Errorf("chunk of %d rows, %d bytes: over %d rows or %d bytes", len(c), bytes, tc.maxRows, chunkBytes)
				}
				flat = append(flat, c...)
			}
			if !slices.Equal(flat, idx) {
				t.Errorf("the chunks hold %d items, not the %d given in order", len(flat), len(idx))
			}
		})
	}
}

func repeatItem(it NewItem, n int) []NewItem {
	items := make([]NewItem, n)
	for i := range items {
		items[i] = it
	}
	return items
}
