package store_test

import (
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestStatementsSplit(t *testing.T) {
	t.Parallel()
	if !strings.Contains(crsql.SchemaSQL(), "CREATE TABLE IF NOT EXISTS crdbwork_items") {
		t.Fatal("embedded schema does not look like schema.sql")
	}
	st := store.NewStatements(crsql.Tables{Prefix: "x_"})
	if strings.Contains(st.ClaimAny, "crdbwork_") || !strings.Contains(st.ClaimAny, `"x_items"`) {
		t.Fatalf("statement not renamed: %s", st.ClaimAny)
	}
	if err := (crsql.Tables{Prefix: strings.Repeat("p", 60)}).Validate(); err == nil {
		t.Fatal("a prefix too long for identifiers was accepted")
	}
}
