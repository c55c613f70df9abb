package store

// AckAllStatement is the pipelined ack's all-or-nothing delete for t
// (items_ack.go), for the plan tests.
func AckAllStatement(t Tables) string { return New(t).ackAll }
