package sql

// NotifyText returns the statement of Store.Notify, for the plan tests of
// package sql_test: the text is unexported.
func NotifyText() string { return notifyStatement }
