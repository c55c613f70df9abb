// Command apicount counts the exported identifiers of a Go module's
// importable packages (not internal/, not main, not tests, not nested
// modules): top-level constants, variables, types and functions, and methods
// of exported types. It measures the size of crdbwork's public API (issue 31:
// at most 420; docs/development.md):
//
//	go -C scripts/apicount run . ../..
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: apicount MODULE-ROOT")
		os.Exit(2)
	}
	root := os.Args[1]
	per := map[string]int{}
	total := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if rel != "." {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		dir := filepath.Dir(rel)
		if dir == "internal" || strings.HasPrefix(dir, "internal/") || strings.Contains(dir, "/internal/") || strings.HasSuffix(dir, "/internal") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parsing %s: %w", rel, err)
		}
		if f.Name.Name == "main" {
			return nil
		}
		n := 0
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv != nil {
					t := d.Recv.List[0].Type
					if s, ok := t.(*ast.StarExpr); ok {
						t = s.X
					}
					if ix, ok := t.(*ast.IndexExpr); ok {
						t = ix.X
					}
					if id, ok := t.(*ast.Ident); !ok || !id.IsExported() {
						continue
					}
				}
				n++
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							n++
						}
					case *ast.ValueSpec:
						for _, nm := range s.Names {
							if nm.IsExported() {
								n++
							}
						}
					}
				}
			}
		}
		per[dir] += n
		total += n
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(1)
	}
	var dirs []string
	for d := range per {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		if per[d] > 0 {
			fmt.Printf("%5d %s\n", per[d], d)
		}
	}
	fmt.Printf("%5d total\n", total)
}
