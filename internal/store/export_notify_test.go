package store

// NotifyText returns the statement of Store.Notify, for the plan tests of
// package sql_test: the text is unexported.
func NotifyText() string { return notifyStatement }

// ProbeText returns the statement of Store.Probe in dialect d, for the
// plan tests.
func ProbeText(t Tables, d Dialect) string {
	p := newProbeStatements(t)
	return byDialect(d, p.probe, p.pgProbe)
}
