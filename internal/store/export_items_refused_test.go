package store

// NewRefusedStatements reaches the statements of refused rows, for the
// plan tests.
var NewRefusedStatements = newRefusedStatements
