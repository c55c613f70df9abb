package claim

// ErrOutcomeUnknownForTest is the error an enqueue with an unknown outcome
// wraps.
var ErrOutcomeUnknownForTest = errEnqueueUnknown
