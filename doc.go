// Package crdbwork coordinates a fleet of workers on CockroachDB (or
// PostgreSQL) with nothing but the database: durable work items, sessions
// that detect dead workers, claiming without contention through parts, and
// exactly-once acknowledgement of every item's result.
//
// This package holds no code: it is the tour. The API lives in the packages
// below, each with runnable examples; the guides are in the repository's
// docs/ directory (https://github.com/crdbwork/crdbwork/tree/main/docs).
//
// # How it works
//
// Three tables do the coordination, and the database enforces every rule:
//
//   - Sessions. Each worker process has a row in crdbwork_sessions and
//     heartbeats it; any process deletes the rows whose last heartbeat is
//     older than the expiry (5 s by default), by the database's clock.
//   - Claims. A worker claims an item by writing its session id into the
//     item's claim column, a foreign key to the session with ON DELETE SET
//     NULL: when a session row goes, the database releases its claims. An
//     item leaves the table only when it is acked, cancelled or dead.
//   - Exactly-once acknowledgement. The ack is one serializable transaction
//     that deletes the item only if the claim still holds and writes the
//     handler's result; at most one ack of an item can commit, and it is
//     reported only after its COMMIT succeeded.
//   - Parts. A queue may be split into a fixed number of parts, divided
//     among the live sessions working it; each claims only in its own parts,
//     so claims never contend, and the database guarantees one owner per
//     part.
//
// # A first program
//
// Apply the schema with [github.com/crdbwork/crdbwork/sql.Apply] (or the
// file sql/schema.sql), name a queue with
// [github.com/crdbwork/crdbwork/claim.New], give it its parts before the
// first item with [github.com/crdbwork/crdbwork/partition.EnsureParts],
// enqueue items inside your own transaction with
// [github.com/crdbwork/crdbwork/claim.Queue.EnqueueTx], and run a worker
// with [github.com/crdbwork/crdbwork/worker.New] and
// [github.com/crdbwork/crdbwork/worker.Worker.Run]. The handler does its
// slow work outside any transaction and returns a
// [github.com/crdbwork/crdbwork/worker.Record], which the worker runs inside
// the ack transaction.
//
// The examples that show each step, and that go test runs against a real
// database:
//
//   - sql's ExampleApply: create or upgrade the schema;
//   - claim's ExampleQueue_EnqueueTx and ExampleBuffer: produce;
//   - worker's ExampleWorker_Run and ExampleRecordValue: consume, with the
//     result written in the ack transaction;
//   - workertest's ExampleWork, ExampleTables and ExampleRequireEnqueued:
//     test a handler, and what your code enqueued;
//   - schedule's ExampleRunner: periodic items;
//   - claim's ExampleQueue_SetTenantLimit: fleet-wide limits;
//   - partition's ExampleSetParts: change a queue's number of parts;
//   - metrics' ExampleCollector: Prometheus metrics.
//
// The repository's examples/quickstart is the whole program.
//
// # Packages
//
//   - [github.com/crdbwork/crdbwork/worker]: a worker process: session,
//     rebalancer, claim loop, bounded handler pool, group-committed acks.
//   - [github.com/crdbwork/crdbwork/claim]: a queue: enqueue (also buffered),
//     claim, ack, nack, release, cancel, dead items, settings and limits,
//     and one read of a queue's state (Queue.Inspect).
//   - [github.com/crdbwork/crdbwork/session]: sessions, their heartbeat and
//     the reaper of expired ones.
//   - [github.com/crdbwork/crdbwork/partition]: assigning parts to sessions,
//     the rebalancer, a queue's number of parts.
//   - [github.com/crdbwork/crdbwork/schedule]: periodic items, enqueued once
//     per period however many processes run the schedule.
//   - [github.com/crdbwork/crdbwork/worker/workertest]: run a handler on one
//     item against a real database; per-test tables; enqueue assertions.
//   - [github.com/crdbwork/crdbwork/metrics]: a Prometheus collector.
//   - [github.com/crdbwork/crdbwork/sql]: the schema, its versions and
//     upgrades, and every statement.
//
// The operator tool is cmd/crdbwork (go install
// github.com/crdbwork/crdbwork/cmd/crdbwork@latest), and cmd/demo is the
// demo that checks exactly-once acknowledgement under faults.
//
// # Guarantees
//
// An item's result is committed at most once, together with the item's
// removal; a worker that dies loses its claims after the session expiry; a
// claim nobody settles is released after its lease; handlers run at least
// once, so external side effects need the item id as an idempotency key; an
// enqueue whose outcome is unknown can be repeated with the same ids without
// running the work twice. The exact statements are in docs/guarantees.md.
package crdbwork
