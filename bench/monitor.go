package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connMonitor samples the number of the measured system's connections to
// the server (pg_stat_activity rows with application_name appName) every
// 10 ms and keeps the peak.
type connMonitor struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	peak   int
	err    error
}

func startConnMonitor(ctx context.Context, url string) (*connMonitor, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connection monitor: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &connMonitor{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		defer conn.Close(context.Background())
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n)
			m.mu.Lock()
			if err != nil && ctx.Err() == nil {
				m.err = err
			}
			m.peak = max(m.peak, n)
			m.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return m, nil
}

// stop ends the sampling and returns the peak.
func (m *connMonitor) stop() (int, error) {
	m.cancel()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak, m.err
}

// loadavg returns the first three fields of /proc/loadavg ("" if unreadable).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

// statements reads and resets pg_stat_statements, when it is loaded.
type statements struct{ on bool }

func newStatements(ctx context.Context, pool *pgxpool.Pool) statements {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return statements{}
	}
	if _, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return statements{}
	}
	return statements{on: true}
}

func (s statements) reset(ctx context.Context, pool *pgxpool.Pool) {
	if s.on {
		_, _ = pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	}
}

// print writes the statements run since the last reset, with calls and
// server execution time per item, most expensive first, and the totals.
// With serverCPU (the server's CPU time over the same span; 0: unknown),
// it also shares that CPU time out among the statements by their shares
// of the execution time: an estimate of each statement's CPU per item
// that the machine's load, which lengthens execution times but not CPU
// times, moves much less than the execution times themselves.
func (s statements) print(ctx context.Context, w io.Writer, pool *pgxpool.Pool, system string, items int, serverCPU time.Duration) error {
	if !s.on {
		return nil
	}
	rows, err := pool.Query(ctx, `SELECT calls, total_exec_time, rows, regexp_replace(query, '\s+', ' ', 'g')
FROM pg_stat_statements
WHERE query NOT LIKE '%pg_stat%'
ORDER BY total_exec_time DESC`)
	if err != nil {
		return fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	type stmt struct {
		calls, rows int64
		ms          float64
		query       string
	}
	var all []stmt
	var calls, total float64
	for rows.Next() {
		var st stmt
		if err := rows.Scan(&st.calls, &st.ms, &st.rows, &st.query); err != nil {
			rows.Close()
			return err
		}
		calls += float64(st.calls)
		total += st.ms
		all = append(all, st)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	cpuPerItem := float64(serverCPU.Microseconds()) / float64(items)
	cpuCol := func(ms float64) string {
		if serverCPU <= 0 || total <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f", cpuPerItem*ms/total)
	}
	fmt.Fprintf(w, "\nstatements of %s (per item of %d; server execution time; ≈CPU: the server's CPU time per item shared out by execution time):\n", system, items)
	fmt.Fprintf(w, "  %9s %10s %8s %9s  %s\n", "calls/it", "µs/it", "≈CPU µs", "rows/call", "statement")
	for i, st := range all {
		if i == 12 {
			break
		}
		q := st.query
		if len(q) > 110 {
			q = q[:110] + "…"
		}
		fmt.Fprintf(w, "  %9.3f %10.1f %8s %9.1f  %s\n", float64(st.calls)/float64(items), st.ms*1000/float64(items), cpuCol(st.ms), float64(st.rows)/float64(max(st.calls, 1)), q)
	}
	fmt.Fprintf(w, "  %9.3f %10.1f %8s %9s  (all statements)\n", calls/float64(items), total*1000/float64(items), cpuCol(total), "")
	return nil
}

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTimes is the CPU time used so far by this process (the client: the
// systems run in it) and by the PostgreSQL server this command started
// (zero with --database-url or off Linux).
type cpuTimes struct{ client, server time.Duration }

// readCPU returns the CPU times now. The server's time is the postmaster's
// own and its reaped children's (exited backends), plus its live children's.
func readCPU(postmaster int) cpuTimes {
	var t cpuTimes
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		t.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if postmaster <= 0 {
		return t
	}
	if f := procStat(postmaster); f != nil {
		t.server = ticks(f, 13, 14, 15, 16)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); f != nil && f[3] == strconv.Itoa(postmaster) {
			t.server += ticks(f, 13, 14)
		}
	}
	return t
}

// procStat returns the fields of /proc/pid/stat, counted from 0 = pid, with
// the command name (which may hold spaces) as one field; nil if unreadable.
func procStat(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	f := append([]string{"pid", "comm"}, strings.Fields(s[i+1:])...)
	if len(f) < 17 {
		return nil
	}
	return f
}

func ticks(f []string, fields ...int) time.Duration {
	var n int64
	for _, i := range fields {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		n += v
	}
	return time.Duration(n) * clockTick
}

func (t cpuTimes) sub(u cpuTimes) cpuTimes {
	return cpuTimes{client: t.client - u.client, server: t.server - u.server}
}

// counts are the statements and round trips of a measured system.
type counts struct {
	statements int64 // pg_stat_statements calls (0 without it)
	trips      int64 // round trips of the system's connections
}

func (c counts) sub(d counts) counts {
	return counts{statements: c.statements - d.statements, trips: c.trips - d.trips}
}

// per1000 formats the counts per 1,000 of items.
func (c counts) per1000(items int) string {
	return fmt.Sprintf("%.1f statements, %.1f round trips", per1000(c.statements, items), per1000(c.trips, items))
}

// per1000 is n per 1,000 of items.
func per1000(n int64, items int) float64 {
	return float64(n) * 1000 / float64(items)
}

// trips counts the round trips of every connection opened by newPool: the
// times a connection writes after it read (or writes first), so that a
// batch or pipeline sent in one go counts once, however many writes it
// takes.
var trips atomic.Int64

// readCounts returns the round trips so far (statements: see
// statements.calls).
func readCounts() counts { return counts{trips: trips.Load()} }

// countTrips makes cfg's connections count their round trips in trips.
func countTrips(cfg *pgx.ConnConfig) {
	dial := cfg.DialFunc
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &tripConn{Conn: c}, nil
	}
}

// tripConn counts a round trip at the first write after a read.
type tripConn struct {
	net.Conn
	sent atomic.Bool // written since the last read
}

func (c *tripConn) Write(b []byte) (int, error) {
	if !c.sent.Swap(true) {
		trips.Add(1)
	}
	return c.Conn.Write(b)
}

func (c *tripConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.sent.Store(false)
	}
	return n, err
}

// calls returns the statements run since the last reset, but the
// connection monitor's and this package's reads of pg_stat_* views (0 when
// pg_stat_statements is not loaded).
func (s statements) calls(ctx context.Context, pool *pgxpool.Pool) int64 {
	if !s.on {
		return 0
	}
	var n int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::BIGINT FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%'`).Scan(&n); err != nil {
		return 0
	}
	return n
}
