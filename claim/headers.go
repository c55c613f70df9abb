package claim

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Headers: small string pairs that travel with an item from its producer to
// its handler (NewItem.Headers, Item.Headers), stored as a JSON object in
// the items' headers column. Trace context is what they are for (package
// otelcrdbwork injects it at enqueue and extracts it in the handler), but
// any producer may set them, and the SQL function crdbwork_enqueue takes
// them too.

// headersBytes returns the bytes of h's keys and values.
func headersBytes(h map[string]string) int {
	n := 0
	for k, v := range h {
		n += len(k) + len(v)
	}
	return n
}

// headersJSON validates h and returns it as a JSON object (nil for none).
func headersJSON(h map[string]string) ([]byte, error) {
	if len(h) == 0 {
		return nil, nil
	}
	if n := headersBytes(h); n > MaxHeadersBytes {
		return nil, fmt.Errorf("%w: the headers are %d bytes, the limit is %d (MaxHeadersBytes)", errBadInput, n, MaxHeadersBytes)
	}
	for k, v := range h {
		switch {
		case k == "":
			return nil, fmt.Errorf("%w: a header has an empty name", errBadInput)
		case !utf8.ValidString(k) || strings.ContainsRune(k, 0):
			return nil, fmt.Errorf("%w: header name %q must be valid UTF-8 without NUL bytes", errBadInput, k)
		case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
			// PostgreSQL's JSONB refuses \u0000, CockroachDB's accepts
			// it: refused on both for the same behaviour.
			return nil, fmt.Errorf("%w: the value of header %q must be valid UTF-8 without NUL bytes", errBadInput, k)
		}
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("%w: encoding the headers: %w", errBadInput, err)
	}
	return b, nil
}

// headersOf decodes the headers column (nil: NULL). A value that is not a
// JSON object of strings (the column written by hand) never stops an item:
// what is not a string is left out, and a column that is not an object
// gives no headers.
func headersOf(b []byte) map[string]string {
	if len(b) == 0 {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) == 0 {
		return nil
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
