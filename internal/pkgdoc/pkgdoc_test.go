package pkgdoc_test

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// skipDirs are never Go packages of the module: fixtures, tools' output, or
// other ecosystems' trees.
var skipDirs = map[string]bool{
	"testdata":     true,
	"node_modules": true,
	".artifacts":   true,
	"bin":          true,
	"vendor":       true,
}

// TestDocComments walks every package of the module and fails for one without
// a package comment, or with an exported top-level name (a function, a type, a
// var or const, a method of an exported type) without a doc comment.
func TestDocComments(t *testing.T) {
	root := moduleRoot(t)
	var packages int
	err := filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if dir != root {
			if skipDirs[name] || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		if checkPackage(t, root, dir) {
			packages++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if packages < 2 {
		t.Fatalf("found %d packages under %s; the walk is broken", packages, root)
	}
}

// moduleRoot is the nearest directory above the test's with a go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// checkPackage checks the package in dir, if there is one, and reports whether
// there was.
func checkPackage(t *testing.T, root, dir string) bool {
	t.Helper()
	// The files of the build for this platform: not tests, not files for
	// other systems or behind an ignore tag (generators, say).
	bp, err := build.ImportDir(dir, 0)
	if _, ok := err.(*build.NoGoError); ok {
		return false
	}
	if err != nil {
		t.Errorf("%s: %v", rel(root, dir), err)
		return false
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		files = append(files, f)
	}

	pkgDoc := false
	for _, f := range files {
		pkgDoc = pkgDoc || f.Doc != nil
	}
	if !pkgDoc {
		t.Errorf("%s: package %s has no package comment", rel(root, dir), bp.Name)
	}
	// Exported names of a command are not API.
	if bp.Name == "main" {
		return true
	}
	for _, f := range files {
		if ast.IsGenerated(f) {
			continue
		}
		for _, missing := range undocumented(f) {
			p := fset.Position(missing.Pos())
			t.Errorf("%s:%d: exported %s has no doc comment", rel(root, p.Filename), p.Line, missing.Name)
		}
	}
	return true
}

// undocumented returns the exported top-level names in f without a doc comment.
// An entry of a parenthesised group is documented by the group's comment, its
// own, or a comment at the end of its line (go doc shows all three).
func undocumented(f *ast.File) []*ast.Ident {
	var out []*ast.Ident
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv != nil && !exportedRecv(d.Recv) {
				continue // a method of an unexported type is not in the docs
			}
			out = append(out, d.Name)
		case *ast.GenDecl:
			if d.Doc != nil {
				continue
			}
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && s.Doc == nil && s.Comment == nil {
						out = append(out, s.Name)
					}
				case *ast.ValueSpec:
					if s.Doc != nil || s.Comment != nil {
						continue
					}
					for _, n := range s.Names {
						if n.IsExported() {
							out = append(out, n)
						}
					}
				}
			}
		}
	}
	return out
}

// exportedRecv reports whether a method's receiver type is exported: T, *T,
// T[P] or *T[P].
func exportedRecv(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	typ := recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
		case *ast.IndexExpr:
			typ = x.X
		case *ast.IndexListExpr:
			typ = x.X
		case *ast.ParenExpr:
			typ = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}

// TestUndocumented checks the checker on a file with every kind of declaration.
func TestUndocumented(t *testing.T) {
	const src = `package p

// Documented is.
func Documented() {}

func Bare() {}

func unexported() {}

// T is.
type T struct{}

func (T) Method() {}

func (*T) PtrMethod() {}

// Doc is.
func (T) Doc() {}

type u struct{}

func (u) Method() {}

type G[P any] struct{}

func (G[P]) Method() {}

type (
	// A is.
	A int
	B int // B is.
	C int
)

// Block covers them all.
const (
	X = iota
	Y
)

var (
	V1    = 1 // V1 is.
	V2, V3 = 2, 3
	v4     = 4
)

var Lone = 1
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, id := range undocumented(f) {
		got = append(got, id.Name)
	}
	want := []string{"Bare", "Method", "PtrMethod", "G", "Method", "C", "V2", "V3", "Lone"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("undocumented = %v, want %v", got, want)
	}
}
