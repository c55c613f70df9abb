package store

// The statement sets are unexported (callers use Store); the plan and text
// tests of package sql_test reach them through these.
var (
	NewStatements          = newCoreStatements
	NewLimitStatements     = newLimitStatements
	NewDeathStatements     = newDeathStatements
	NewDedupStatements     = newDedupStatements
	NewEnqueueStatements   = newEnqueueStatements
	NewFairStatements      = newFairStatements
	NewInspectStatements   = newInspectStatements
	NewMemberStatements    = newMemberStatements
	NewPartClaimStatements = newPartClaimStatements
	NewMoveStatements      = newMoveStatements
	NewScheduleStatements  = newScheduleStatements
	NewReapStatements      = newReapStatements
	NewUrgentStatements    = newUrgentStatements
	NewSequenceStatements  = newSequenceStatements
	NewTestStatements      = newTestStatements
)

// The statements of checkpoints and retention, for the plan tests.
var (
	NewCheckpointStatements = newCheckpointStatements
	NewRetentionStatements  = newRetentionStatements
)
