package sql

// NotifyText returns the statement of Store.Notify, for the plan tests of
// package sql_test: the text is unexported.
func NotifyText() string { return notifyStatement }

// ProbeText returns the statement of Store.Probe, for the plan tests.
func ProbeText(t Tables) string { return newProbeStatements(t).probe }
