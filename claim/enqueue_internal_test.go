package claim

import (
	"reflect"
	"slices"
	"testing"
)

// The chunk plan keeps every statement and COPY under chunkBytes and its row
// limit, keeps the items in order, and loses none.
func TestEnqueueChunkPlan(t *testing.T) {
	t.Parallel()
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
		{"one item at the limits", []NewItem{{Payload: make([]byte, MaxPayloadLimit), Metadata: make([]byte, MaxPayloadLimit), Key: string(make([]byte, MaxKeyLength)), Tenant: string(make([]byte, MaxKeyLength))}}, insertRows, 1},
		{"5000 items with long keys and tenants", repeatItem(NewItem{Payload: []byte("x"), Key: string(make([]byte, MaxKeyLength)), Tenant: string(make([]byte, MaxKeyLength))}, 5000), insertRows, 3},
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

// TestRowBytesCountsEveryVariableField: every string and byte slice of
// NewItem goes into the row, so each must count in rowBytes, or a batch of
// items that fill it could exceed the bound of one statement (CockroachDB
// refuses messages over 16 MiB). A field added later fails here until
// rowBytes counts it.
func TestRowBytesCountsEveryVariableField(t *testing.T) {
	t.Parallel()
	const size = 1000
	base := rowBytes(&NewItem{})
	typ := reflect.TypeFor[NewItem]()
	checked := 0
	for i := range typ.NumField() {
		f := typ.Field(i)
		var it NewItem
		v := reflect.ValueOf(&it).Elem().Field(i)
		switch {
		case f.Type.Kind() == reflect.String:
			v.SetString(string(make([]byte, size)))
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Uint8:
			v.SetBytes(make([]byte, size))
		case f.Type == reflect.TypeFor[map[string]string]():
			v.Set(reflect.ValueOf(map[string]string{"k": string(make([]byte, size))}))
		default:
			continue
		}
		checked++
		if got := rowBytes(&it) - base; got < size {
			t.Errorf("NewItem.%s of %d bytes adds %d to rowBytes", f.Name, size, got)
		}
	}
	if checked < 4 {
		t.Fatalf("checked %d variable-length fields of NewItem; want payload, metadata, key and tenant at least", checked)
	}
}
