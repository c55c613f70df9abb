package store

// NewDependsStatements renders the dependency statements for the plan
// tests of package sql_test.
var NewDependsStatements = newDependsStatements
var NewAcrossStatements = newAcrossStatements
