package store_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// itemOptionColumns are the columns of crdbwork_items that an item's
// options (claim.NewItem) fill: every statement that writes an item row
// carries each of them, or says here why not (itemWriters).
var itemOptionColumns = []string{"item_key", "priority", "vesting_at", "max_attempts", "payload", "metadata", "tenant",
	"expires_at", "at_most_once", "headers", "seq_order", "turn_at", "timeout_us", "kind"}

// itemWriters are the statements that insert item rows, by where they are
// (the Go name of the statement or constant, or the file), each with the
// option columns it does not carry and why (the documentation says so).
var itemWriters = map[string]map[string]string{
	"insertTemplate":                 {}, // enqueue's INSERT
	"CopyColumns":                    {}, // enqueue's COPY
	"moveReady":                      {}, // a waiting item's release
	"enqueue_function.sql":           {}, // crdbwork_enqueue
	"cockroach_enqueue_function.sql": {},
	"requeueSQL": { // a dead item put back
		"expires_at":   "no deadline (docs/guarantees.md)",
		"at_most_once": "at-least-once (a dead item was never at-most-once)",
		"headers":      "dead items keep no headers (docs/tracing.md, limits)",
		"timeout_us":   "dead items keep no timeout: a requeued item runs with its worker's ItemTimeout (docs/timeouts.md)",
	},
	"cancelledRequeueSQL": { // a cancelled item put back (RequeueOptions.Cancelled)
		"expires_at":   "no deadline, as a dead item's requeue (docs/cancel-and-snooze.md)",
		"at_most_once": "at-least-once: an at-most-once item is deleted by its claim, and one cancelled before it is requeued at least once, as a dead one",
		"timeout_us":   "a cancelled item keeps no timeout: requeued, it runs with its worker's ItemTimeout (docs/timeouts.md)",
	},
}

// TestEveryWriterOfItemsKeepsTheOptions: each statement of this package
// that inserts item rows (found in its source), and the SQL function of
// package sql (its SQL files), is listed
// in itemWriters, and names every option column but those it lists as
// dropped. A new way to write items (another release, another requeue)
// fails here until it carries every option of the item or documents what
// it drops: the way a waiting item's release once dropped its headers and
// sequence order.
func TestEveryWriterOfItemsKeepsTheOptions(t *testing.T) {
	t.Parallel()
	found := map[string][]string{} // writer → its columns
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	insert := regexp.MustCompile(`INSERT INTO crdbwork_items(?:\s+AS\s+\w+)?\s*\(([^)]*)\)`)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var stack []string // enclosing names
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case nil:
				return false
			case *ast.ValueSpec:
				stack = append(stack, n.Names[0].Name)
				for _, v := range n.Values {
					ast.Inspect(v, inspectLits(insert, &stack, found))
				}
				stack = stack[:len(stack)-1]
				return false
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok {
					stack = append(stack, k.Name)
					ast.Inspect(n.Value, inspectLits(insert, &stack, found))
					stack = stack[:len(stack)-1]
					return false
				}
			}
			return true
		})
	}
	for _, name := range []string{"enqueue_function.sql", "cockroach_enqueue_function.sql"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "sql", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range insert.FindAllStringSubmatch(string(raw), -1) {
			found[name] = columns(m[1])
		}
	}
	found["CopyColumns"] = store.NewEnqueueStatements(crsql.Tables{}).CopyColumns
	for writer, cols := range found {
		drops, ok := itemWriters[writer]
		if !ok {
			t.Errorf("%s inserts item rows (columns %v) and is not in itemWriters: list it with the option columns it does not carry", writer, cols)
			continue
		}
		for _, c := range itemOptionColumns {
			_, dropped := drops[c]
			switch has := slices.Contains(cols, c); {
			case !has && !dropped:
				t.Errorf("%s writes item rows without %s, an item option's column (columns %v): carry it, or list it in itemWriters with the documentation that says so", writer, c, cols)
			case has && dropped:
				t.Errorf("%s writes %s, which itemWriters says it drops: remove that entry", writer, c)
			}
		}
	}
	for writer := range itemWriters {
		if _, ok := found[writer]; !ok {
			t.Errorf("itemWriters lists %s, which inserts no item rows", writer)
		}
	}
	t.Logf("item writers: %v", found)
}

// inspectLits records the column list of each INSERT INTO crdbwork_items
// of a string literal under the innermost enclosing name.
func inspectLits(insert *regexp.Regexp, stack *[]string, found map[string][]string) func(ast.Node) bool {
	return func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		for _, m := range insert.FindAllStringSubmatch(s, -1) {
			found[(*stack)[len(*stack)-1]] = columns(m[1])
		}
		return true
	}
}

func columns(list string) []string {
	var out []string
	for _, c := range strings.Split(list, ",") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}
