package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat. It
// is 100 on every Linux architecture Go supports, and reading it properly
// (sysconf) would take cgo.
const clockTicks = 100

// procSample is one reading of a process's counters.
type procSample struct {
	at     time.Time
	cpu    time.Duration // utime + stime since the process started
	rssKiB int64
}

// sampleProc reads pid's CPU time and resident memory from /proc.
func sampleProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// pid (comm) state ppid ...: comm may hold spaces, so count from the ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	// Fields 14 and 15 of stat(5); fields[0] is field 3, the state.
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("/proc/%d/stat: bad utime/stime %q %q", pid, fields[11], fields[12])
	}
	s.cpu = time.Duration(utime+stime) * time.Second / clockTicks
	s.rssKiB, err = readRSS(pid)
	return s, err
}

// schedCPU returns the CPU time pid's threads have run, in nanoseconds, from
// /proc/<pid>/task/*/schedstat: finer than stat's 10ms ticks, which matters for
// a mostly idle process. Threads that have exited are not counted (a Go
// program seldom ends one).
func schedCPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread has just exited
		}
		first, _, _ := strings.Cut(string(b), " ")
		ns, err := strconv.ParseInt(first, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/task/%s/schedstat: %q", pid, t.Name(), b)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// readRSS returns VmRSS from /proc/<pid>/status, in KiB.
func readRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmRSS %q", pid, v)
			}
			return kb, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// machineSample is a reading of the whole machine's CPU counters.
type machineSample struct {
	at   time.Time
	idle time.Duration // idle + iowait of every CPU since boot
}

// sampleMachine reads the machine's idle time from /proc/stat.
func sampleMachine() (machineSample, error) {
	s := machineSample{at: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return s, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var idle uint64
	for _, f := range fields[4:6] { // idle, iowait
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc/stat: %q", f)
		}
		idle += v
	}
	s.idle = time.Duration(idle) * time.Second / clockTicks
	return s, nil
}

// machineBusy is the CPU time every process used between two readings: the
// machine's capacity over that time (its CPUs × the wall time) less what it
// spent idle. It is not /proc/stat's user + system + ...: on this VM those
// busy ticks go missing under load (busy + idle added up to 166–187% of two
// cores over the loaded windows issue 16 looked at, against 199–200% when
// quiet), which read as 10–22 points of negative interference, while the idle
// time (kept exactly by the kernel's tickless idle accounting) adds up.
func machineBusy(a, b machineSample) time.Duration {
	return time.Duration(runtime.NumCPU())*b.at.Sub(a.at) - (b.idle - a.idle)
}

// cpuMeter measures the CPU a set of processes spends over a window, and what
// the rest of the machine spends beside them (on a shared machine, the noise).
type cpuMeter struct {
	pids   map[string]int
	before map[string]procSample
	after  map[string]procSample
	// the machine at the window's start and end.
	machine [2]machineSample
	err     error
}

func newCPUMeter(pids map[string]int) *cpuMeter {
	return &cpuMeter{pids: pids, before: map[string]procSample{}, after: map[string]procSample{}}
}

// mark samples every process at the window's start (open) or end.
func (m *cpuMeter) mark(open bool) {
	dst, mi := m.after, 1
	if open {
		dst, mi = m.before, 0
	}
	ms, err := sampleMachine()
	if err != nil && m.err == nil {
		m.err = err
	}
	m.machine[mi] = ms
	for name, pid := range m.pids {
		s, err := sampleProc(pid)
		if err != nil && m.err == nil {
			m.err = fmt.Errorf("sample %s (pid %d): %w", name, pid, err)
		}
		dst[name] = s
	}
}

// perRequest returns each process's CPU time over the window divided by n.
func (m *cpuMeter) perRequest(n uint64) map[string]float64 {
	out := make(map[string]float64, len(m.pids))
	for name := range m.pids {
		b, a := m.before[name], m.after[name]
		if n == 0 || a.at.IsZero() || b.at.IsZero() {
			continue
		}
		out[name] = float64(a.cpu-b.cpu) / float64(time.Microsecond) / float64(n)
	}
	return out
}

// othersPercent is the CPU the rest of the machine used over the window, in
// percent of one core: machineBusy less what the metered processes used. It
// is not clamped at 0 (issue 16), so what is left of the counters'
// disagreement shows (a few points either way; see the route scenario's rest
// readings), rather than being hidden along with as much interference.
func (m *cpuMeter) othersPercent() float64 {
	var ours time.Duration
	for name := range m.pids {
		b, a := m.before[name], m.after[name]
		ours += a.cpu - b.cpu
	}
	el := m.machine[1].at.Sub(m.machine[0].at)
	if el <= 0 {
		return 0
	}
	return 100 * float64(machineBusy(m.machine[0], m.machine[1])-ours) / float64(el)
}

// managerSample is a process's CPU and memory over a stretch of time, beside
// this process's CPU and the whole machine's.
type managerSample struct {
	elapsed    time.Duration
	cpu        time.Duration // the manager's, from schedstat
	bench      time.Duration // this process's, from stat
	machine    time.Duration // every process's (machineBusy)
	rssKiB     int64         // at the end
	peakRSSKiB int64         // of one-second samples
}

// cpuPercent is the manager's CPU, in percent of one core.
func (s managerSample) cpuPercent() float64 { return percentOf(s.cpu, s.elapsed) }

// benchPercent is this process's CPU, in percent of one core.
func (s managerSample) benchPercent() float64 {
	return percentOf(s.bench, s.elapsed)
}

// othersPercent is what the rest of the machine used beside the manager and
// the bench. The machine's counters tick at 10ms: it is approximate, and
// not clamped (see cpuMeter.othersPercent).
func (s managerSample) othersPercent() float64 {
	return percentOf(s.machine-s.cpu-s.bench, s.elapsed)
}

func percentOf(d, over time.Duration) float64 {
	if over <= 0 {
		return 0
	}
	return 100 * float64(d) / float64(over)
}

// sampleManager measures pid for d, reading its RSS every second: the
// manager's footprint over a window (idle, under a feed, at scale).
func sampleManager(ctx context.Context, pid int, d time.Duration) (managerSample, error) {
	var s managerSample
	t0 := time.Now()
	c0, err := readCPUCounters(pid)
	if err != nil {
		return s, err
	}
	end := t0.Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			break
		}
		if err := sleep(ctx, min(left, time.Second)); err != nil {
			return s, err
		}
		rss, err := readRSS(pid)
		if err != nil {
			return s, err
		}
		s.peakRSSKiB = max(s.peakRSSKiB, rss)
	}
	c1, err := readCPUCounters(pid)
	if err != nil {
		return s, err
	}
	s.elapsed = time.Since(t0)
	s.cpu, s.bench, s.machine = c1.manager-c0.manager, c1.bench-c0.bench, machineBusy(c0.machine, c1.machine)
	if s.rssKiB, err = readRSS(pid); err != nil {
		return s, err
	}
	s.peakRSSKiB = max(s.peakRSSKiB, s.rssKiB)
	return s, nil
}

// cpuCounters are the cumulative CPU times a managerSample is the difference
// of: the manager's, this process's and the whole machine's.
type cpuCounters struct {
	manager, bench time.Duration
	machine        machineSample
}

// readCPUCounters reads pid's CPU time (schedstat, in ns: an idle manager's
// is a fraction of stat's 10ms ticks), this process's and the machine's.
func readCPUCounters(pid int) (cpuCounters, error) {
	var c cpuCounters
	var err error
	if c.manager, err = schedCPU(pid); err != nil {
		return c, err
	}
	self, err := sampleProc(os.Getpid())
	if err != nil {
		return c, err
	}
	c.bench = self.cpu
	c.machine, err = sampleMachine()
	return c, err
}
