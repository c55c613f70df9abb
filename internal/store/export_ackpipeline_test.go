package store

// AckAllStatement is the pipelined ack's all-or-nothing delete for t
// (store_ackpipeline.go), for the plan tests.
func AckAllStatement(t Tables) string { return New(t).ackAll }
