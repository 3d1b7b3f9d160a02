package systemd_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// instance is one bot of TestRealSystemdTemplates: sm-manager@name with its
// socket, and the listen ports its config got from the README's sed.
type instance struct {
	name     string
	portBase string // "748": status 7480, metrics 7481, sm-api 7482
}

func (i instance) manager() string { return "sm-manager@" + i.name + ".service" }
func (i instance) socket() string  { return "sm-manager@" + i.name + ".socket" }
func (i instance) api() string     { return "sm-api@" + i.name + ".service" }
func (i instance) path() string    { return "/run/sm/" + i.name + ".sock" }
func (i instance) apiURL() string  { return "http://127.0.0.1:" + i.portBase + "2" }

// readmeInstanceConfig is config.example.toml edited as the README's
// "Several bots on one host" does (its sed) for bot name and listen ports
// portBase0-portBase2, so a drift between the two fails here.
func readmeInstanceConfig(t *testing.T, name, portBase string) []byte {
	t.Helper()
	b, err := os.ReadFile("../config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ re, with string }{
		{`(?m)^socket = .*$`, fmt.Sprintf(`socket = "/run/sm/%s.sock"`, name)},
		{`(?m)^dir = "/tmp/sm/state"$`, fmt.Sprintf(`dir = "/var/lib/sm/%s"`, name)},
		{`127\.0\.0\.1:748([0-9])`, "127.0.0.1:" + portBase + "$1"},
	} {
		re := regexp.MustCompile(r.re)
		if !re.Match(b) {
			t.Fatalf("config.example.toml has no line matching %s: update the README's \"Several bots on one host\"", r.re)
		}
		b = re.ReplaceAll(b, []byte(r.with))
	}
	return b
}

// TestREADMETemplateSed checks that the README's "Several bots on one host"
// runs the sed readmeInstanceConfig mirrors.
func TestREADMETemplateSed(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`-e "s|^socket = .*|socket = \"/run/sm/$bot.sock\"|"`,
		`-e "s|^dir = \"/tmp/sm/state\"|dir = \"/var/lib/sm/$bot\"|"`,
		`-e "s|127.0.0.1:748\([0-9]\)|127.0.0.1:$port\1|"`,
		"install -m644 systemd/sm-manager@.socket systemd/sm-manager@.service systemd/sm-api@.service /etc/systemd/system/",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("README.md lacks %s", want)
		}
	}
}

// TestRealSystemdTemplates runs two bots side by side from the templated
// units, each installed as the README says: each has its own socket, state
// directory, clusters and sm-api; stopping one leaves the other serving, and
// a crash of the other's manager leaves its clusters to be re-adopted from
// its own state directory.
func TestRealSystemdTemplates(t *testing.T) {
	t.Parallel()
	c := bootContainer(t)
	c.install(nil)
	bots := []instance{{"alpha", "748"}, {"beta", "749"}}
	for _, b := range bots {
		c.installConfigTextAs(readmeInstanceConfig(t, b.name, b.portBase), b.name)
		c.sh(fmt.Sprintf("umask 077; echo SM_API_TOKEN=token-%s-0123456789abcdef > /etc/sm/%s-api.env", b.name, b.name))
	}
	// Which clusters (pids) each manager started, by instance name.
	pids := map[string][]string{}
	for _, step := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"systemd-analyze verify", func(t *testing.T) {
			// Instances of the templates, as systemd loads them.
			out, errOut, err := c.run("sh", "-c", `cd /etc/systemd/system && for u in sm-manager@alpha.socket sm-manager@alpha.service sm-api@alpha.service; do
				ln -sf "$(echo $u | sed 's/@alpha/@/')" /tmp/$u; done && systemd-analyze verify /tmp/sm-manager@alpha.socket /tmp/sm-manager@alpha.service /tmp/sm-api@alpha.service`)
			if err != nil || errOut != "" || out != "" {
				t.Fatalf("systemd-analyze verify: %v\nstdout: %s\nstderr: %s", err, out, errOut)
			}
		}},
		{"start both", func(t *testing.T) {
			for _, b := range bots {
				c.must("systemctl", "start", b.socket(), b.manager())
			}
			for _, b := range bots {
				c.waitStatusOf(b.manager(), "4/4 clusters ready, generation 1")
				if got := c.sh("stat -c '%a %U %G' " + b.path()); got != "660 root sm" {
					t.Errorf("%s: mode/owner %q, want 660 root sm", b.path(), got)
				}
				if got := c.must("/usr/local/bin/smclient", "-socket", b.path(), "-clusters", "4", "-rounds", "3"); got != "ok 12" {
					t.Fatalf("smclient %s: %q", b.path(), got)
				}
				pids[b.name] = c.childPIDs(b.manager())
				if len(pids[b.name]) != 4 {
					t.Fatalf("%s has cluster processes %v, want 4", b.manager(), pids[b.name])
				}
			}
			for _, p := range pids["alpha"] {
				if slices.Contains(pids["beta"], p) {
					t.Fatalf("cluster pid %s in both instances", p)
				}
			}
		}},
		{"own state directories", func(t *testing.T) {
			for _, b := range bots {
				dir := "/var/lib/sm/" + b.name
				if got := c.sh("stat -c '%U' " + dir); got != "sm" {
					t.Errorf("%s owned by %q", dir, got)
				}
				// The state file names this instance's clusters, and only them.
				st := c.must("cat", dir+"/manager-state.json")
				for _, p := range pids[b.name] {
					if !namesPID(st, p) {
						t.Errorf("%s/manager-state.json does not name cluster pid %s", dir, p)
					}
				}
				for _, o := range bots {
					if o.name == b.name {
						continue
					}
					for _, p := range pids[o.name] {
						if namesPID(st, p) {
							t.Errorf("%s/manager-state.json names %s's cluster pid %s", dir, o.name, p)
						}
					}
				}
			}
		}},
		{"one sm-api each", func(t *testing.T) {
			for _, b := range bots {
				c.must("systemctl", "start", b.api())
			}
			for _, b := range bots {
				c.waitHTTP(b.apiURL() + "/readyz")
				// Its own manager: the cluster pids its /v1/status names.
				st := c.must("curl", "-sf", "-H", "Authorization: Bearer token-"+b.name+"-0123456789abcdef", b.apiURL()+"/v1/status")
				for _, p := range pids[b.name] {
					if !namesPID(st, p) {
						t.Errorf("%s /v1/status does not name cluster pid %s:\n%s", b.api(), p, st)
					}
				}
				// And its own token: the other bot's is refused.
				for _, o := range bots {
					if o.name != b.name {
						code := c.must("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Authorization: Bearer token-"+o.name+"-0123456789abcdef", b.apiURL()+"/v1/status")
						if code != "401" {
							t.Errorf("%s answered %s to %s's token", b.api(), code, o.name)
						}
					}
				}
			}
		}},
		{"stop one", func(t *testing.T) {
			alpha, beta := bots[0], bots[1]
			betaMain := c.show(beta.manager(), "MainPID")
			c.must("systemctl", "stop", alpha.manager())
			for _, u := range []string{alpha.manager(), alpha.api()} {
				if got, _, _ := c.run("systemctl", "is-active", u); got != "inactive" {
					t.Errorf("%s is %q after stopping %s", u, got, alpha.manager())
				}
			}
			for _, p := range pids[alpha.name] {
				if c.processAlive(p) {
					t.Errorf("alpha's cluster %s outlived its manager's stop", p)
				}
			}
			for _, u := range []string{beta.socket(), beta.manager(), beta.api()} {
				if got, _, _ := c.run("systemctl", "is-active", u); got != "active" {
					t.Errorf("%s is %q after stopping %s", u, got, alpha.manager())
				}
			}
			if got := c.show(beta.manager(), "MainPID"); got != betaMain {
				t.Errorf("beta's manager replaced (pid %s, was %s)", got, betaMain)
			}
			if got := c.childPIDs(beta.manager()); !slices.Equal(got, pids[beta.name]) {
				t.Errorf("beta's clusters %v after stopping alpha, were %v", got, pids[beta.name])
			}
			if got := c.must("/usr/local/bin/smclient", "-socket", beta.path(), "-clusters", "4", "-rounds", "2"); got != "ok 8" {
				t.Fatalf("smclient beta: %q", got)
			}
			c.waitHTTP(beta.apiURL() + "/readyz")
		}},
		{"crash of one re-adopts from its own state", func(t *testing.T) {
			beta := bots[1]
			before := c.show(beta.manager(), "MainPID")
			c.must("systemctl", "kill", "--kill-whom=main", "-s", "KILL", beta.manager())
			var now string
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				now = c.show(beta.manager(), "MainPID")
				active, _, _ := c.run("systemctl", "is-active", beta.manager())
				if now != before && now != "0" && active == "active" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("beta's manager not restarted: MainPID %s, %s", now, active)
				}
			}
			c.waitStatusOf(beta.manager(), "4/4 clusters ready, generation 1")
			if got := c.must("/usr/local/bin/smclient", "-socket", beta.path(), "-clusters", "4", "-rounds", "2"); got != "ok 8" {
				t.Fatalf("smclient beta after its manager's crash: %q", got)
			}
			// Adopted: the same processes, now the new manager's (they
			// are not its children, so look in the unit's cgroup).
			if got := c.unitPIDs(beta.manager(), now); !slices.Equal(got, pids[beta.name]) {
				t.Errorf("beta's clusters %v after its manager's crash, were %v", got, pids[beta.name])
			}
			if got, _, _ := c.run("systemctl", "is-active", bots[0].manager()); got != "inactive" {
				t.Errorf("alpha's manager is %q: beta's crash started it", got)
			}
		}},
		{"stop the other", func(t *testing.T) {
			beta := bots[1]
			c.must("systemctl", "stop", beta.manager())
			for _, p := range pids[beta.name] {
				if c.processAlive(p) {
					t.Errorf("beta's cluster %s outlived its manager's stop", p)
				}
			}
		}},
	} {
		ok := t.Run(step.name, func(t *testing.T) {
			c.t = t
			defer func() { c.t = nil }()
			step.run(t)
		})
		if !ok {
			return
		}
	}
}

// namesPID reports whether the JSON doc has a "pid" field of value pid.
func namesPID(doc, pid string) bool {
	return regexp.MustCompile(`"pid":\s*` + pid + `\b`).MatchString(doc)
}

// childPIDs lists the cluster processes whose parent is unit's main process.
func (c *container) childPIDs(unit string) []string {
	c.t.Helper()
	out, _, _ := c.run("pgrep", "-P", c.show(unit, "MainPID"), "-f", "/usr/local/bin/cluster-harness")
	pids := strings.Fields(out)
	slices.Sort(pids)
	return pids
}

// unitPIDs lists the processes of unit's cgroup other than mainPID.
func (c *container) unitPIDs(unit, mainPID string) []string {
	c.t.Helper()
	cg := c.show(unit, "ControlGroup")
	var pids []string
	for _, p := range strings.Fields(c.must("cat", "/sys/fs/cgroup"+cg+"/cgroup.procs")) {
		if p != mainPID {
			pids = append(pids, p)
		}
	}
	slices.Sort(pids)
	return pids
}

// processAlive reports whether pid names a live process in the container.
func (c *container) processAlive(pid string) bool {
	_, _, err := c.run("kill", "-0", pid)
	return err == nil
}

// waitHTTP waits until url answers 200.
func (c *container) waitHTTP(url string) {
	c.t.Helper()
	var code string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code, _, _ = c.run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url); code == "200" {
			return
		}
	}
	c.t.Fatalf("%s: %q", url, code)
}
