package store

import "github.com/jackc/pgx/v5/pgtype"

// uuidArray is a UUID[] parameter that pgx encodes with no allocation per
// element: as a plain [][16]byte each element would be boxed into an
// interface (16 bytes on the heap) and wrapped again to be encoded, a few
// allocations per item of every ack. Here each element is a uuidRef, a
// pointer-shaped value that boxes for free and hands its bytes to the UUID
// codec directly (pgtype.UUIDValuer). The encoded bytes are the same.
type uuidArray [][16]byte

// Dimensions implements pgtype.ArrayGetter: one dimension (a nil array is
// NULL).
func (a uuidArray) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter.
func (a uuidArray) Index(i int) any { return uuidRef{&a[i]} }

// IndexType implements pgtype.ArrayGetter.
func (a uuidArray) IndexType() any { return uuidRef{&[16]byte{}} }

// uuidRef is one element of a uuidArray.
type uuidRef struct{ b *[16]byte }

// UUIDValue implements pgtype.UUIDValuer.
func (r uuidRef) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: *r.b, Valid: true}, nil }
