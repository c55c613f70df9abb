// Package partition divides each queue's parts among the live sessions
// that work the queue (its members: session.Members), so that every session
// claims only in its own parts and claims never contend, as Kafka's
// consumer groups divide a topic's partitions. Many queues share one
// database: sessions that work other queues take no part of this one.
//
// Assign is the pure assignment function: from the ids of the live sessions
// and the number of parts, the parts each session should own. AssignSticky
// gives the same balance while moving fewer parts when sessions come and go.
//
// A Rebalancer runs beside a session. It joins the session to its queue
// (session.Session.Join), polls the queue's live members, computes
// the session's target parts, drains and gives up the parts it must lose
// (deleting their session-parts rows, which releases their claims through
// the foreign key) and takes the free parts it should own (inserting rows;
// a conflict means "not free yet"). The unique constraint on (queue, part)
// in the database, not this package, guarantees one owner per part.
//
// Each queue's number of parts is stored in the database (SetParts, Parts),
// so every producer and worker agrees on it.
package partition
