package sql_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// binaryNames matches text that names a program: the repository's demo
// binary (and its commands), the coming operator CLI's commands, and the
// database clients. A library error that names one goes stale when the
// program is renamed or is not installed where the library runs.
var binaryNames = regexp.MustCompile("(?i)\\bdemo\\b|\\bpsql\\b|cockroach sql|crdbwork (migrate|status)|cmd/")

// commandFlag matches a command-line flag named in prose ("run it with
// --download-cockroach"); a lone "--flag" literal is an argument the
// library passes to a program it runs, and is fine.
var commandFlag = regexp.MustCompile(`\s.*(^|[\s(])--[a-z]|(^|[\s(])--[a-z].*\s`)

// TestSentinelErrorsNameNoBinary checks the schema errors' texts: they say
// what to do through the library (sql.Apply) or the schema file, and name no
// program.
func TestSentinelErrorsNameNoBinary(t *testing.T) {
	t.Parallel()
	for _, err := range []error{crsql.ErrSchemaMissing, crsql.ErrSchemaOutdated, crsql.ErrSchemaNewer} {
		if m := binaryNames.FindString(err.Error()); m != "" {
			t.Errorf("error %q names a program (%q)", err, m)
		}
	}
}

// TestLibraryStringsNameNoBinary reads the library's Go sources (every
// package but cmd/, examples/ and bench/, which are programs, internal/cli,
// the programs' shared plumbing, and tests) and
// fails on a string literal that names a program: error texts, log
// messages and hints of a library must stay true whichever binary uses it.
// Comments are not checked.
func TestLibraryStringsNameNoBinary(t *testing.T) {
	t.Parallel()
	root := ".."
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "cmd", "examples", "bench", filepath.Join("internal", "cli"), ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				s = lit.Value
			}
			if m := binaryNames.FindString(s); m != "" {
				t.Errorf("%s: string %s names a program (%q)", fset.Position(lit.Pos()), lit.Value, m)
			}
			if commandFlag.MatchString(s) {
				t.Errorf("%s: string %s names a command-line flag", fset.Position(lit.Pos()), lit.Value)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Fatalf("checked %d library files: the walk missed the sources", checked)
	}
}
