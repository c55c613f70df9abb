package sql

import _ "embed"

//go:embed schema.sql
var schemaFile string

//go:embed cockroach.sql
var cockroachFile string

// SchemaSQL returns the schema file with the default table names, exactly as
// shipped in sql/schema.sql.
func SchemaSQL() string { return schemaFile }

// CockroachSQL returns the CockroachDB-only settings, exactly as shipped in
// sql/cockroach.sql.
func CockroachSQL() string { return cockroachFile }
