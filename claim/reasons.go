package claim

import (
	"errors"
	"fmt"
	"strings"
)

// reasons are the reasons a dead item can have (DeadItem.Reason), in the
// order Reasons lists them; ReasonDependencyDied is followed by an id.
var reasons = []string{ReasonFailed, ReasonPermanent, ReasonCrashLoop, ReasonExpired, ReasonSnoozedTooOften,
	strings.TrimSuffix(ReasonDependencyDied, ": "), ReasonCancelled, ReasonRefused,
	strings.TrimSuffix(ReasonUnknownKind, ": "), strings.TrimSuffix(ReasonBadArgs, ": ")}

// kindReasons are the reasons followed by an item's kind.
var kindReasons = []string{ReasonUnknownKind, ReasonBadArgs}

// Reasons returns every reason a dead item can end with, as a filter
// (DeadFilter.Reason) takes them: "failed", "permanent", "crash loop",
// "expired", "snoozed too often", "dependency died" (which matches every
// "dependency died: <id>"), "cancelled", "refused by the database",
// "unknown kind" (which matches every "unknown kind: <kind>") and "bad
// arguments" (every "bad arguments: <kind>").
func Reasons() []string { return append([]string(nil), reasons...) }

// kindFilter splits a filter of a reason followed by a kind ("unknown
// kind: mail") into the reason's prefix and the kind, which the store
// matches exactly against the dead item's kind column (the kind in the
// reason is the item's own: Nack writes both). ok is false for any other
// filter.
func kindFilter(r string) (prefix, kind string, ok bool) {
	for _, p := range kindReasons {
		if k, found := strings.CutPrefix(r, p); found && k != "" {
			return p, k, true
		}
	}
	return "", "", false
}

// ErrUnknownReason is returned (wrapped) by DeadItems and Requeue for a
// DeadFilter.Reason that no dead item can have.
var ErrUnknownReason = errors.New("no dead item can have this reason")

// reasonPrefix returns the filter r as the prefix of the reasons it
// matches: r itself for a reason (none is a prefix of another), for
// "dependency died" (or "dependency died: ") every dependency death, for
// "dependency died: <id or its start>" the deaths of those prerequisites.
// It wraps ErrUnknownReason for anything else.
func reasonPrefix(r string) (string, error) {
	switch {
	case r == "":
		return "", nil
	case r == strings.TrimSuffix(ReasonDependencyDied, ": ") || r == strings.TrimSuffix(ReasonDependencyDied, " "):
		return ReasonDependencyDied, nil
	case r == strings.TrimSuffix(ReasonUnknownKind, ": ") || r == strings.TrimSuffix(ReasonUnknownKind, " "):
		return ReasonUnknownKind, nil
	case r == strings.TrimSuffix(ReasonBadArgs, ": ") || r == strings.TrimSuffix(ReasonBadArgs, " "):
		return ReasonBadArgs, nil
	case strings.HasPrefix(r, ReasonUnknownKind) || strings.HasPrefix(r, ReasonBadArgs):
		return r, nil
	case strings.HasPrefix(r, ReasonDependencyDied):
		id := strings.ToLower(strings.TrimPrefix(r, ReasonDependencyDied))
		if len(id) > 36 || strings.Trim(id, "0123456789abcdef-") != "" {
			return "", fmt.Errorf("reason %q: %w: after %q comes a prerequisite's id or its start", r, ErrUnknownReason, ReasonDependencyDied)
		}
		return ReasonDependencyDied + id, nil
	}
	for _, k := range reasons {
		if r == k {
			return r, nil
		}
	}
	return "", fmt.Errorf("reason %q: %w (reasons: %s; %q takes a prerequisite's id or its start after it, %q and %q a kind)",
		r, ErrUnknownReason, strings.Join(quoteAll(reasons), ", "), ReasonDependencyDied, ReasonUnknownKind, ReasonBadArgs)
}

// MatchReason reports whether a dead item's reason matches the filter
// (DeadFilter.Reason) as DeadItems matches it: "" matches every reason;
// "dependency died" matches every "dependency died: <id>", and
// "dependency died: <id or its start>" those it starts; "unknown kind"
// and "bad arguments" match those reasons whatever the kind after them;
// any other filter matches its reason exactly.
func MatchReason(filter, reason string) bool {
	p, err := reasonPrefix(filter)
	if err != nil {
		return false
	}
	if strings.HasPrefix(p, ReasonDependencyDied) || p == ReasonUnknownKind || p == ReasonBadArgs {
		return strings.HasPrefix(reason, p)
	}
	return p == "" || reason == p
}

// CheckReason returns nil if r is a filter DeadFilter.Reason accepts (see
// Reasons, MatchReason), else an error wrapping ErrUnknownReason that
// lists the reasons.
func CheckReason(r string) error {
	_, err := reasonPrefix(r)
	return err
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
