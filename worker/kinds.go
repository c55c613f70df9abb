package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// Job is one claimed item of a kind registered with AddKind: the item, and
// its payload decoded into the kind's arguments. The raw payload is still
// there (Item.Payload).
type Job[T claim.Args] struct {
	claim.Item
	// Args are the item's arguments, decoded from its payload as JSON.
	Args T
}

// Kinds runs each item of a queue with the handler of its kind
// (claim.NewItem.Kind): one worker, one queue, many kinds, as River's
// Workers or Oban's workers. Register the handlers with AddKind (typed
// arguments, JSON) or Handle (raw payload), then give Handler to
// Options.Handler:
//
//	kinds := worker.NewKinds()
//	worker.AddKind(kinds, sendMail)   // func(ctx, worker.Job[SendMail]) (worker.Record, error)
//	worker.AddKind(kinds, resizeImage)
//	opts.Handler = kinds.Handler()
//
// An item whose kind has no handler (a producer newer than this worker, or
// a typo) ends dead with reason "unknown kind: <kind>" (claim.ReasonUnknownKind),
// without a retry: no attempt of this worker can run it. With UnknownWait
// set it waits instead, for a worker that knows its kind. An item whose
// payload does not decode into its kind's arguments ends dead with reason
// "bad arguments: <kind>" and the decoder's error as its last error. An
// item without a kind runs with Default.
//
// A worker whose Options.Observer is a KindObserver (package metrics'
// Collector) tells it each run's kind, and whether it is one registered
// here (HandlerRun.Registered), so that metrics by kind stay bounded by the
// registered kinds.
//
// Set the fields and register the kinds before calling Handler: the
// handler it returns keeps what was registered then.
type Kinds struct {
	// Default runs the items without a kind (enqueued without
	// claim.NewItem.Kind, by code that predates kinds, say). Nil: they are
	// items of an unknown kind, "".
	Default Handler
	// UnknownWait, if positive, makes an item of an unknown kind wait
	// instead of ending dead: it is snoozed (put back without using an
	// attempt, claim.SnoozeUnlimited) for UnknownEvery at a time, so that
	// a worker that knows its kind (a newer deployment, rolling out) can
	// take it, until UnknownWait has passed since it was enqueued (by the
	// database clock: its vesting time minus its enqueue time, delay
	// included); then it ends dead as without the wait. Zero: no wait.
	UnknownWait time.Duration
	// UnknownEvery is how long an item of an unknown kind waits each time
	// (UnknownWait). Default DefaultUnknownEvery.
	UnknownEvery time.Duration
	// OnUnknown, if set, is called for each claim of an item of an unknown
	// kind, with whether it waits (false: it ends dead): log it or count
	// it (the item also shows its kind and its snoozes to an operator:
	// crdbwork item <id>). Called on the handler's goroutine; keep it
	// quick.
	OnUnknown func(it claim.Item, waits bool)

	handlers map[string]Handler
}

// DefaultUnknownEvery is Kinds.UnknownEvery's default: how long an item of an
// unknown kind waits each time for a worker that knows it.
const DefaultUnknownEvery = 30 * time.Second

// NewKinds returns an empty set of kinds' handlers.
func NewKinds() *Kinds { return &Kinds{} }

// AddKind registers h as the handler of the items of T's kind (T's zero
// value's Kind()): h receives each such item with its payload decoded into
// T (encoding/json; unknown fields are ignored, so that a producer may add
// fields before its workers know them). It panics if the kind is empty or
// already registered, as http.Handle does: a registration is the
// program's, not its input.
func AddKind[T claim.Args](k *Kinds, h func(ctx context.Context, job Job[T]) (Record, error)) {
	var zero T
	kind := zero.Kind()
	if h == nil {
		panic(fmt.Sprintf("worker: AddKind of kind %q: nil handler", kind))
	}
	k.Handle(kind, func(ctx context.Context, it claim.Item) (Record, error) {
		job := Job[T]{Item: it}
		if err := json.Unmarshal(it.Payload, &job.Args); err != nil {
			return nil, &claim.ArgsError{Kind: it.Kind, Err: err}
		}
		return h(ctx, job)
	})
}

// Handle registers h as the handler of the items of kind, with their raw
// payload (claim.Item.Payload): for kinds whose payload is not JSON. It
// panics if kind is empty, longer than claim.MaxKindLength, or already
// registered.
func (k *Kinds) Handle(kind string, h Handler) {
	switch {
	case kind == "":
		panic("worker: a kind's handler needs a kind: Kind() returned \"\" (Kinds.Default runs the items without one)")
	case len(kind) > claim.MaxKindLength:
		panic(fmt.Sprintf("worker: kind %q is over claim.MaxKindLength bytes", kind))
	case h == nil:
		panic(fmt.Sprintf("worker: kind %q: nil handler", kind))
	}
	if _, dup := k.handlers[kind]; dup {
		panic(fmt.Sprintf("worker: kind %q is registered twice", kind))
	}
	if k.handlers == nil {
		k.handlers = map[string]Handler{}
	}
	k.handlers[kind] = h
}

// Names returns the registered kinds, sorted.
func (k *Kinds) Names() []string { return slices.Sorted(maps.Keys(k.handlers)) }

// Handler returns the queue's Handler that runs each item with its kind's
// handler (see Kinds). It keeps the kinds registered so far.
func (k *Kinds) Handler() Handler {
	handlers := maps.Clone(k.handlers)
	def, wait, every, onUnknown := k.Default, k.UnknownWait, k.UnknownEvery, k.OnUnknown
	if every <= 0 {
		every = DefaultUnknownEvery
	}
	return func(ctx context.Context, it claim.Item) (Record, error) {
		if it.Kind == "" && def != nil {
			attempt.MarkKindKnown(ctx) // for a KindObserver (HandlerRun.Registered)
			return def(ctx, it)
		}
		if h, ok := handlers[it.Kind]; ok {
			attempt.MarkKindKnown(ctx)
			return h(ctx, it)
		}
		waits := wait > 0 && it.VestingAt.Sub(it.EnqueuedAt) < wait
		if onUnknown != nil {
			onUnknown(it, waits)
		}
		if waits {
			return nil, claim.SnoozeUnlimited(every)
		}
		return nil, &claim.UnknownKindError{Kind: it.Kind}
	}
}
