package systemd_test

import (
	"os"
	"strings"
	"testing"
)

// directives are a unit file's lines without comments and blank lines.
func directives(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// TestTemplatesFollowPlainUnits: each templated unit is its plain unit with
// the instance name in the paths, the unit names and the description, and
// nothing else, so a fix to one cannot miss the other.
func TestTemplatesFollowPlainUnits(t *testing.T) {
	inst := strings.NewReplacer(
		"/etc/sm/sm.toml", "/etc/sm/%i.toml",
		"/etc/sm/sm-api.env", "/etc/sm/%i-api.env",
		"/run/sm/sm.sock", "/run/sm/%i.sock",
		"StateDirectory=sm", "StateDirectory=sm/%i",
		"sm-manager.socket", "sm-manager@%i.socket",
		"sm-manager.service", "sm-manager@%i.service",
		"Description=sm-manager,", "Description=sm-manager %i,",
		"Description=sm-manager IPC", "Description=sm-manager %i IPC",
		"Description=sm-api,", "Description=sm-api %i,",
	)
	for plain, tmpl := range map[string]string{
		"sm-manager.service": "sm-manager@.service",
		"sm-manager.socket":  "sm-manager@.socket",
		"sm-api.service":     "sm-api@.service",
	} {
		want, got := directives(t, plain), directives(t, tmpl)
		if len(want) != len(got) {
			t.Errorf("%s has %d directives, %s %d", tmpl, len(got), plain, len(want))
			continue
		}
		for i := range want {
			if w := inst.Replace(want[i]); w != got[i] {
				t.Errorf("%s: %q, want %q (from %s's %q)", tmpl, got[i], w, plain, want[i])
			}
		}
	}
}
