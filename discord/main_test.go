package discord_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDocComments checks that the package and every exported name say what
// they are.
func TestDocComments(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/sm-supervisor/sm/discord")
	if err != nil {
		t.Fatal(err)
	}
	if p.Doc == "" {
		t.Error("package discord has no package comment")
	}
	missing := func(what, name, d string) {
		if strings.TrimSpace(d) == "" {
			t.Errorf("%s %s has no doc comment", what, name)
		}
	}
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			if v.Doc != "" {
				continue
			}
			for _, spec := range v.Decl.Specs {
				vs := spec.(*ast.ValueSpec)
				for _, n := range vs.Names {
					if n.IsExported() && vs.Doc.Text() == "" && vs.Comment.Text() == "" {
						t.Errorf("%s has no doc comment", n.Name)
					}
				}
			}
		}
	}
	values(p.Consts)
	values(p.Vars)
	for _, f := range p.Funcs {
		missing("func", f.Name, f.Doc)
	}
	for _, ty := range p.Types {
		missing("type", ty.Name, ty.Doc)
		values(ty.Consts)
		values(ty.Vars)
		for _, f := range ty.Funcs {
			missing("func", f.Name, f.Doc)
		}
		for _, m := range ty.Methods {
			// Error and String implement well-known interfaces; their name says it.
			if m.Name != "Error" && m.Name != "String" {
				missing("method", ty.Name+"."+m.Name, m.Doc)
			}
		}
	}
}
