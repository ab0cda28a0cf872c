// River as the queue benchmark's peer (bench/queue.rs, scenario `river`; issue #34): the same
// backlog worked by River's in-process workers on the same PostgreSQL.
//
//	river -url postgres://…/fresh_db -jobs 10000 -workers 16
//
// Runs River's migrations (rivermigrate) on the database, inserts -jobs jobs of a no-op kind with
// COPY (InsertManyFast, not timed), VACUUM ANALYZEs river_job as the Rust bench does its own
// backlog, then starts a client with -workers workers on the default queue and times from Start
// until every job's completion has been committed (River's completion events are sent after the
// completer's transaction). Prints one line:
//
//	river version=v0.51.2 jobs=N workers=16 seconds=… jobs_per_s=… worked_seconds=…
//
// worked_seconds is when the last job's Work returned; the rest up to seconds is the completer's
// last batch. River's settings are its defaults except FetchCooldown and FetchPollInterval (and the
// log level): in particular its batch completer, which sets many jobs `completed` in one statement
// and one commit, which is what the comparison is about.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// noopArgs is a job that does nothing: the benchmark measures the queue, not the work.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	worked *atomic.Int64
	total  int64
	last   chan time.Time
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	if w.worked.Add(1) == w.total {
		w.last <- time.Now()
	}
	return nil
}

func riverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "github.com/riverqueue/river" {
				return m.Version
			}
		}
	}
	return "unknown"
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "river bench: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	url := flag.String("url", "", "PostgreSQL URL of a database for River (migrated here)")
	jobs := flag.Int("jobs", 10_000, "backlog: jobs inserted before the client starts")
	workers := flag.Int("workers", 16, "MaxWorkers of the default queue")
	cooldown := flag.Duration("fetch-cooldown", time.Millisecond, "River FetchCooldown")
	poll := flag.Duration("fetch-poll-interval", 10*time.Millisecond, "River FetchPollInterval")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	flag.Parse()
	if *url == "" || *jobs < 1 || *workers < 1 {
		fail("usage: river -url postgres://… [-jobs N] [-workers W]")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	cfg, err := pgxpool.ParseConfig(*url)
	if err != nil {
		fail("parsing -url: %v", err)
	}
	// Room for the workers' fetches, the completer, the leader's maintenance and the notifier.
	cfg.MaxConns = int32(*workers + 8)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fail("connecting: %v", err)
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)

	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		fail("migrator: %v", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		fail("migrating: %v", err)
	}

	worked := &atomic.Int64{}
	last := make(chan time.Time, 1)
	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{worked: worked, total: int64(*jobs), last: last})
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     *cooldown,
		FetchPollInterval: *poll,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: *workers}},
		Workers:           ws,
	})
	if err != nil {
		fail("client: %v", err)
	}

	// The backlog, not timed: COPY in batches.
	const batch = 10_000
	params := make([]river.InsertManyParams, 0, batch)
	for inserted := 0; inserted < *jobs; inserted += len(params) {
		params = params[:0]
		for i := inserted; i < *jobs && len(params) < batch; i++ {
			params = append(params, river.InsertManyParams{Args: noopArgs{}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			fail("inserting: %v", err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE river_job"); err != nil {
		fail("VACUUM ANALYZE: %v", err)
	}

	// Every completion event; a buffer of the whole backlog so none is dropped.
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: *jobs,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer unsubscribe()

	started := time.Now()
	if err := client.Start(ctx); err != nil {
		fail("starting: %v", err)
	}
	var lastWorked time.Time
	for done := 0; done < *jobs; {
		select {
		case e := <-events:
			if e.Kind != river.EventKindJobCompleted {
				fail("job %d: %s", e.Job.ID, e.Kind)
			}
			done++
		case t := <-last:
			lastWorked = t
		case <-ctx.Done():
			fail("timed out with %d of %d jobs completed", done, *jobs)
		}
	}
	elapsed := time.Since(started)
	if lastWorked.IsZero() {
		lastWorked = <-last
	}
	if err := client.Stop(ctx); err != nil {
		fail("stopping: %v", err)
	}
	var completed int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'completed'").Scan(&completed); err != nil {
		fail("counting: %v", err)
	}
	if completed != *jobs {
		fail("%d jobs completed in river_job, %d expected", completed, *jobs)
	}
	fmt.Printf("river version=%s jobs=%d workers=%d seconds=%.3f jobs_per_s=%.0f worked_seconds=%.3f\n",
		riverVersion(), *jobs, *workers, elapsed.Seconds(), float64(*jobs)/elapsed.Seconds(),
		lastWorked.Sub(started).Seconds())
}
