package discord_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sm-supervisor/sm/discord"
)

func writeToken(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

func TestLoadToken(t *testing.T) {
	const env = "SM_TEST_DISCORD_TOKEN"
	tests := []struct {
		name    string
		file    func(t *testing.T) string
		env     *string // nil: unset
		want    string
		wantErr []string // substrings of the error; nil: no error
		is      error
	}{
		{name: "file, trimmed", file: func(t *testing.T) string { return writeToken(t, "  "+testToken+"\n", 0o600) },
			want: testToken},
		{name: "file 0400", file: func(t *testing.T) string { return writeToken(t, testToken, 0o400) },
			want: testToken},
		{name: "file with Bot prefix", file: func(t *testing.T) string { return writeToken(t, "Bot "+testToken+"\n", 0o600) },
			want: testToken},
		{name: "file wins over env", file: func(t *testing.T) string { return writeToken(t, testToken, 0o600) },
			env: ptr("other-token"), want: testToken},
		{name: "env", env: ptr(testToken + "\n"), want: testToken},
		{name: "group-readable file refused", file: func(t *testing.T) string { return writeToken(t, testToken, 0o640) },
			wantErr: []string{"group or others", "0640", "chmod 600"}, is: discord.ErrTokenFileMode},
		{name: "world-readable file refused", file: func(t *testing.T) string { return writeToken(t, testToken, 0o644) },
			env: ptr(testToken), wantErr: []string{"0644"}, is: discord.ErrTokenFileMode},
		{name: "missing file, no fallback to env", file: func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") },
			env: ptr(testToken), wantErr: []string{"nope"}, is: os.ErrNotExist},
		{name: "empty file", file: func(t *testing.T) string { return writeToken(t, " \n", 0o600) },
			wantErr: []string{"empty"}},
		{name: "two lines", file: func(t *testing.T) string { return writeToken(t, testToken+"\n"+testToken+"\n", 0o600) },
			wantErr: []string{"white space"}},
		{name: "huge file", file: func(t *testing.T) string { return writeToken(t, strings.Repeat(testToken, 100), 0o600) },
			wantErr: []string{"longer than"}},
		{name: "directory", file: func(t *testing.T) string { return t.TempDir() },
			wantErr: []string{"not a regular file"}},
		{name: "fifo", file: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Skip("mkfifo:", err)
			}
			return p
		}, wantErr: []string{"not a regular file"}},
		{name: "env unset", env: nil, wantErr: []string{env, "unset or empty"}},
		{name: "env empty", env: ptr("  "), wantErr: []string{env, "unset or empty"}},
		{name: "env with a space", env: ptr("abc def" + testToken), wantErr: []string{env, "white space"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != nil {
				t.Setenv(env, *tt.env)
			} else {
				t.Setenv(env, "")
				os.Unsetenv(env)
			}
			file := ""
			if tt.file != nil {
				file = tt.file(t)
			}
			got, err := discord.LoadToken(file, env)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if got != tt.want {
					t.Errorf("token is wrong (length %d, want %d)", len(got), len(tt.want))
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want errors.Is %v", err, tt.is)
			}
			assertNoToken(t, err)
		})
	}
}

func TestLoadTokenNothingNamed(t *testing.T) {
	if _, err := discord.LoadToken("", ""); !errors.Is(err, discord.ErrNoToken) {
		t.Errorf("err = %v, want ErrNoToken", err)
	}
}

func ptr[T any](v T) *T { return &v }
