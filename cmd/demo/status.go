package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

type sessionStatus struct {
	ID                    string  `json:"id"`
	Name                  string  `json:"name"`
	Host                  string  `json:"host"`
	PID                   int64   `json:"pid"`
	CreatedAt             string  `json:"created_at"`
	HeartbeatAt           string  `json:"heartbeat_at"`
	AgeSeconds            float64 `json:"age_seconds"`
	SinceHeartbeatSeconds float64 `json:"since_heartbeat_seconds"`
	ExpirySeconds         float64 `json:"expiry_seconds"`
	Parts                 string  `json:"parts"` // owned parts of --queue, as ranges ("0-3,8")
	NumParts              int     `json:"num_parts"`
}

type ownerStatus struct {
	Session string `json:"session"`
	Name    string `json:"name,omitempty"`
	Parts   string `json:"parts"`
	Count   int    `json:"count"`
}

type backlogRow struct {
	Queue     string `json:"queue"`
	Part      int64  `json:"part"`
	Unclaimed int64  `json:"unclaimed"`
	Vested    int64  `json:"vested"`
	Claimed   int64  `json:"claimed"`
}

type backlogTotal struct {
	Queue     string `json:"queue"`
	Items     int64  `json:"items"`
	Unclaimed int64  `json:"unclaimed"`
	Vested    int64  `json:"vested"`
	Claimed   int64  `json:"claimed"`
}

type status struct {
	Engine       string          `json:"engine"`
	Queue        string          `json:"queue"`
	NumParts     int             `json:"num_parts"`
	Sessions     []sessionStatus `json:"sessions"`
	PartOwners   []ownerStatus   `json:"part_owners"`
	UnownedParts string          `json:"unowned_parts"`
	Backlog      []backlogRow    `json:"backlog"`
	Queues       []backlogTotal  `json:"queues"`
	Dead         int64           `json:"dead"`
}

// readStatus gathers the status of queue.
func readStatus(ctx context.Context, db crsql.DB, queue string) (*status, error) {
	st := crsql.NewStatements(tables)
	s := &status{Engine: engineName(ctx, db), Queue: queue, Sessions: []sessionStatus{},
		PartOwners: []ownerStatus{}, Backlog: []backlogRow{}, Queues: []backlogTotal{}}
	var err error
	if s.NumParts, err = partition.Parts(ctx, db, tables, queue); err != nil {
		return nil, err
	}
	infos, err := session.List(ctx, db, tables)
	if err != nil {
		return nil, err
	}
	names := map[uuid.UUID]string{}
	for _, in := range infos {
		names[in.ID] = in.Name
	}

	// Part owners.
	rows, err := db.Query(ctx, st.PartOwners, queue)
	if err != nil {
		return nil, fmt.Errorf("reading part owners: %w", crsql.Classify(err))
	}
	byOwner := map[uuid.UUID][]int{}
	owned := map[int]bool{}
	var order []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		var part int64
		if err := rows.Scan(&id, &part); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading part owners: %w", err)
		}
		if _, ok := byOwner[id]; !ok {
			order = append(order, id)
		}
		byOwner[id] = append(byOwner[id], int(part))
		owned[int(part)] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading part owners: %w", err)
	}
	for _, id := range order {
		s.PartOwners = append(s.PartOwners, ownerStatus{Session: id.String(), Name: names[id],
			Parts: ranges(byOwner[id]), Count: len(byOwner[id])})
	}
	var unowned []int
	for p := 0; p < s.NumParts; p++ {
		if !owned[p] {
			unowned = append(unowned, p)
		}
	}
	s.UnownedParts = ranges(unowned)

	for _, in := range infos {
		s.Sessions = append(s.Sessions, sessionStatus{
			ID: in.ID.String(), Name: in.Name, Host: in.Host, PID: in.PID,
			CreatedAt: in.CreatedAt.UTC().Format(time.RFC3339Nano), HeartbeatAt: in.HeartbeatAt.UTC().Format(time.RFC3339Nano),
			AgeSeconds: in.Age.Seconds(), SinceHeartbeatSeconds: in.SinceHeartbeat.Seconds(), ExpirySeconds: in.Expiry.Seconds(),
			Parts: ranges(byOwner[in.ID]), NumParts: len(byOwner[in.ID]),
		})
	}

	// Backlog, every queue.
	rows, err = db.Query(ctx, st.Backlog)
	if err != nil {
		return nil, fmt.Errorf("reading the backlog: %w", crsql.Classify(err))
	}
	totals := map[string]*backlogTotal{}
	var queues []string
	for rows.Next() {
		var r backlogRow
		if err := rows.Scan(&r.Queue, &r.Part, &r.Unclaimed, &r.Vested, &r.Claimed); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the backlog: %w", err)
		}
		s.Backlog = append(s.Backlog, r)
		t := totals[r.Queue]
		if t == nil {
			t = &backlogTotal{Queue: r.Queue}
			totals[r.Queue] = t
			queues = append(queues, r.Queue)
		}
		t.Items += r.Unclaimed + r.Claimed
		t.Unclaimed += r.Unclaimed
		t.Vested += r.Vested
		t.Claimed += r.Claimed
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the backlog: %w", err)
	}
	sort.Strings(queues)
	for _, q := range queues {
		s.Queues = append(s.Queues, *totals[q])
	}
	if err := db.QueryRow(ctx, st.DeadCount, queue).Scan(&s.Dead); err != nil {
		return nil, fmt.Errorf("counting dead items: %w", crsql.Classify(err))
	}
	return s, nil
}

// ranges writes sorted parts compactly: [0 1 2 3 8] is "0-3,8".
func ranges(parts []int) string {
	if len(parts) == 0 {
		return ""
	}
	ps := append([]int(nil), parts...)
	sort.Ints(ps)
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ps[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ps[j]))
		}
		i = j + 1
	}
	return b.String()
}

func cmdStatus(ctx context.Context, name string, args []string, out *console) error {
	var c common
	f := newFlagSet(name, `Shows the live sessions (with the parts of --queue each one owns), the
parts nobody owns, the backlog of every queue by part (unclaimed, vested =
unclaimed and due, claimed), and the number of dead items of --queue.`)
	c.register(f, urlRequired)
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	pool, err := connect(ctx, c.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool); err != nil {
		return err
	}
	s, err := readStatus(ctx, pool, c.queue)
	if err != nil {
		return failf(1, "%v", err)
	}
	if c.json {
		return printJSON(out, s)
	}
	out.printf("%s", formatStatus(s))
	return nil
}

func formatStatus(s *status) string {
	var b strings.Builder
	fmt.Fprintf(&b, "engine %s; queue %q: %d parts, %d dead items\n\n", s.Engine, s.Queue, s.NumParts, s.Dead)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintf(&b, "%d live sessions\n", len(s.Sessions))
	if len(s.Sessions) > 0 {
		fmt.Fprintln(tw, "SESSION\tNAME\tHOST\tPID\tAGE\tHEARTBEAT\tPARTS")
		for _, ss := range s.Sessions {
			parts := ss.Parts
			if parts == "" {
				parts = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s ago\t%s\n", ss.ID, orDash(ss.Name), orDash(ss.Host), ss.PID,
				round(secs(ss.AgeSeconds)), round(secs(ss.SinceHeartbeatSeconds)), parts)
		}
		tw.Flush()
	}
	// Owners that are not live sessions (expired, not yet reaped).
	live := map[string]bool{}
	for _, ss := range s.Sessions {
		live[ss.ID] = true
	}
	for _, o := range s.PartOwners {
		if !live[o.Session] {
			fmt.Fprintf(&b, "parts %s of %q are held by expired session %s (released when a peer reaps it)\n", o.Parts, s.Queue, o.Session)
		}
	}
	if s.UnownedParts != "" {
		fmt.Fprintf(&b, "parts of %q owned by nobody: %s\n", s.Queue, s.UnownedParts)
	}
	fmt.Fprintln(&b)
	if len(s.Backlog) == 0 {
		fmt.Fprintln(&b, "backlog: no items in any queue")
		return b.String()
	}
	fmt.Fprintln(&b, "backlog")
	fmt.Fprintln(tw, "QUEUE\tPART\tUNCLAIMED\tVESTED\tCLAIMED")
	for _, r := range s.Backlog {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", r.Queue, r.Part, r.Unclaimed, r.Vested, r.Claimed)
	}
	for _, t := range s.Queues {
		fmt.Fprintf(tw, "%s\tall\t%d\t%d\t%d\n", t.Queue, t.Unclaimed, t.Vested, t.Claimed)
	}
	tw.Flush()
	return b.String()
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
