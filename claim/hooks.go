package claim

import (
	"context"
	"errors"
	"fmt"
)

// Hooks: a small, dependency-free interface through which code outside the
// package (tracing, logging, auditing) joins a queue's work without wrapping
// every call site: Options.Hooks wraps every enqueue and is told of every
// claim, ack, nack and release. Package otelcrdbwork (a module of its own,
// so that the library does not import OpenTelemetry) implements it.

// Hooks are called around a queue's work (Options.Hooks). Embed NoHooks to
// implement only some of the methods. Options stays comparable with ==
// when the dynamic type of its Hooks is (a pointer, for example). Methods
// are called from many goroutines at once.
type Hooks interface {
	// Enqueue wraps every enqueue of the queue: Enqueue, EnqueueTx (next
	// then writes in the caller's transaction) and Buffer.Enqueue (with its
	// one item; next then waits for the buffer's flush). It is called with
	// the caller's context, the queue's name and the items, and must call
	// next once with the items to enqueue and return what next returned
	// (it may wrap the error): for example start a span, add trace context
	// to the items' Headers, call next and end the span with its result.
	// It must not change the caller's items or their Headers maps: it
	// passes copies to next, as many items as it was given, in the same
	// order (the Enqueued answers them by index); a different number fails
	// the enqueue. Calls with no items do not reach it.
	Enqueue(ctx context.Context, queue string, items []NewItem, next EnqueueFunc) (Enqueued, error)
	// Step is called when a claim, an ack transaction, a nack or a release
	// starts; the function it returns (nil: none) is called once when the
	// step ends, with the step's error (nil when it succeeded; for an ack
	// transaction, the items' errors joined). It must be quick, and must
	// not change the step's items.
	Step(ctx context.Context, s *Step) (end func(err error))
}

// EnqueueFunc enqueues items: what Hooks.Enqueue calls to go on.
type EnqueueFunc func(ctx context.Context, items []NewItem) (Enqueued, error)

// NoHooks implements Hooks doing nothing: embed it in a type that
// implements only some of the methods.
type NoHooks struct{}

// Enqueue calls next with the items.
func (NoHooks) Enqueue(ctx context.Context, _ string, items []NewItem, next EnqueueFunc) (Enqueued, error) {
	return next(ctx, items)
}

// Step does nothing.
func (NoHooks) Step(context.Context, *Step) func(error) { return nil }

// StepKind names the steps Hooks.Step is told of.
type StepKind string

// The steps of an item's life that Hooks.Step is told of.
const (
	StepClaim   StepKind = "claim"   // Claimer.Claim and ClaimUrgent
	StepAck     StepKind = "ack"     // Ack and AckMany: one step per transaction
	StepNack    StepKind = "nack"    // Nack
	StepRelease StepKind = "release" // Release
)

// Step is one claim, ack transaction, nack or release of a queue, as
// Hooks.Step sees it.
type Step struct {
	Kind  StepKind
	Queue string
	// Items are the step's items: those an ack, nack or release settles
	// (set when the step starts), and for a claim, the items it claimed
	// (nil when the step starts, set before the end function is called).
	Items []Item
}

// startStep tells the queue's Hooks that a step on items starts and
// returns what to call when it ends (nil without a hook).
func (q *Queue) startStep(ctx context.Context, kind StepKind, items []Item) func(items []Item, err error) {
	h := q.opts.Hooks
	if h == nil {
		return nil
	}
	s := &Step{Kind: kind, Queue: q.opts.Queue, Items: items}
	end := h.Step(ctx, s)
	return func(items []Item, err error) {
		if end == nil {
			return
		}
		if items != nil {
			s.Items = items
		}
		end(err)
	}
}

// hooked runs an enqueue of items through the queue's Hooks, if any.
func (q *Queue) hooked(ctx context.Context, items []NewItem, next EnqueueFunc) (Enqueued, error) {
	h := q.opts.Hooks
	if h == nil || len(items) == 0 {
		return next(ctx, items)
	}
	n := len(items)
	called := false
	res, err := h.Enqueue(ctx, q.opts.Queue, items, func(ctx context.Context, got []NewItem) (Enqueued, error) {
		if called {
			return Enqueued{}, fmt.Errorf("claim: enqueueing into %q: %w: the Hooks' Enqueue called next twice", q.opts.Queue, errBadInput)
		}
		called = true
		if len(got) != n {
			return Enqueued{}, fmt.Errorf("claim: enqueueing into %q: %w: the Hooks' Enqueue passed %d items on, of %d", q.opts.Queue, errBadInput, len(got), n)
		}
		return next(ctx, got)
	})
	if !called && err == nil {
		return Enqueued{}, errors.New("claim: the Hooks' Enqueue returned without enqueueing (it did not call next)")
	}
	return res, err
}
