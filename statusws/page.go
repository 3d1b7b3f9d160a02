package statusws

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"strings"
)

// The status page: plain HTML, CSS and JavaScript, no build step.
//
//go:embed page
var pageFiles embed.FS

// pageCSP keeps the page to its own files; the feed's data is untrusted (the
// heartbeat payloads are whatever the bot sends) and the page only ever puts
// it in the DOM as text, but the policy is the second fence.
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'"

// pageHandler serves the embedded page: index.html at /, its assets beside it.
func pageHandler() http.Handler {
	sub, err := fs.Sub(pageFiles, "page")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	// Embedded files carry no modification time: an ETag of their content lets
	// browsers revalidate cheaply, and a new sm-manager's page replaces the old.
	etags := map[string]string{}
	fs.WalkDir(sub, ".", func(name string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := fs.ReadFile(sub, name)
			sum := sha256.Sum256(b)
			etags["/"+name] = `"` + hex.EncodeToString(sum[:8]) + `"`
		}
		return nil
	})
	etags["/"] = etags["/index.html"]
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if tag, ok := etags[r.URL.Path]; ok && !strings.HasSuffix(r.URL.Path, "/index.html") {
			h.Set("ETag", tag)
		}
		h.Set("Content-Security-Policy", pageCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
