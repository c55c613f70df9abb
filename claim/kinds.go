package claim

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// Args are an item's typed arguments (River's JobArgs): a value whose
// Kind names what the item is, and that encodes to the item's payload as
// JSON. ArgsItem makes the NewItem of such a value; a worker.Kinds runs
// it with the handler registered for its kind, which receives the value
// decoded again. Kind must be a constant of the type, answered by its zero
// value too (worker.AddKind asks the zero value).
type Args interface {
	Kind() string
}

// ArgsItem returns the NewItem of args: its Kind, and its JSON encoding
// (encoding/json) as the Payload. Set the item's other fields (Key,
// Delay, UniqueKey, …) on the result before enqueueing it:
//
//	it, err := claim.ArgsItem(SendMail{To: "ada@example.com"})
//	if err != nil {
//		return err
//	}
//	it.Key = "ada"
//	_, err = q.Enqueue(ctx, it)
//
// It fails, wrapping ErrBadArgs, if args is a nil pointer, its kind is
// empty, or it does not encode. (Enqueue checks the kind's length and text,
// as for any item.)
func ArgsItem(args Args) (NewItem, error) {
	if args == nil || isNilPointer(args) {
		return NewItem{}, fmt.Errorf("claim: typed arguments: %w: nil", ErrBadArgs)
	}
	kind := args.Kind()
	if kind == "" {
		return NewItem{}, fmt.Errorf("claim: typed arguments of type %T: %w: Kind() is empty", args, ErrBadArgs)
	}
	payload, err := json.Marshal(args)
	if err != nil {
		return NewItem{}, fmt.Errorf("claim: typed arguments of kind %q: %w: %w", kind, ErrBadArgs, err)
	}
	return NewItem{Kind: kind, Payload: payload}, nil
}

func isNilPointer(v any) bool {
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}

// ErrBadArgs is wrapped by ArgsItem's errors, and by the error of a
// worker.Kinds handler whose item's payload does not decode into its
// arguments (see ArgsError).
var ErrBadArgs = errors.New("bad typed arguments")

// Reasons of dead items that name the item's kind after them.
const (
	// ReasonUnknownKind, followed by the kind, is the reason of an item
	// that a worker.Kinds had no handler for (an UnknownKindError): a
	// producer newer than the workers, or a typo. Requeue it once a worker
	// that knows the kind runs.
	ReasonUnknownKind = "unknown kind: "
	// ReasonBadArgs, followed by the kind, is the reason of an item whose
	// payload did not decode into its kind's arguments (an ArgsError): a
	// retry cannot fix it. Its last error is the decoder's.
	ReasonBadArgs = "bad arguments: "
)

// UnknownKindError is the error of an item whose kind no handler is
// registered for (worker.Kinds). Nack ends such an item dead at once, with
// reason ReasonUnknownKind and the kind: the worker that claimed it cannot
// run it however often it tries.
type UnknownKindError struct {
	// Kind is the item's kind.
	Kind string
}

func (e *UnknownKindError) Error() string {
	return fmt.Sprintf("unknown kind %q: no handler is registered for it in this worker", e.Kind)
}

// ArgsError is the error of an item whose payload does not decode into
// the arguments of its kind's handler (worker.AddKind). Nack ends such an
// item dead at once (no retry can fix its payload), with reason
// ReasonBadArgs and the kind, and this error as its last error.
type ArgsError struct {
	// Kind is the item's kind.
	Kind string
	// Err is the decoder's error.
	Err error
}

func (e *ArgsError) Error() string {
	return fmt.Sprintf("kind %q: the payload does not decode into its arguments: %v", e.Kind, e.Err)
}

// Unwrap returns ErrBadArgs and the decoder's error.
func (e *ArgsError) Unwrap() []error { return []error{ErrBadArgs, e.Err} }

// kindReason returns the reason of death a cause names by itself (an
// UnknownKindError or an ArgsError), or "".
func kindReason(cause error) string {
	var u *UnknownKindError
	if errors.As(cause, &u) && u != nil {
		return ReasonUnknownKind + u.Kind
	}
	var a *ArgsError
	if errors.As(cause, &a) && a != nil {
		return ReasonBadArgs + a.Kind
	}
	return ""
}
