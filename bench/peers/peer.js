// peer.js drains no-op jobs with one of crdbwork's Node.js peers, for the
// bench table (go -C bench run . table), which starts it as a child process:
//
//   node peer.js graphile|pgboss --url URL --items N [--jobs 24] [--batch 500] [--workers 4]
//
// It speaks one JSON object per line on stdout and reads one word per line
// on stdin:
//
//   -> {"ready":true,...}     the schema is there and N jobs are queued (untimed)
//   <- go                     the Go side has taken its marks: start the workers
//   -> {"done":true,...}      every job's completion is committed: elapsed_ms,
//                             handled (handler calls), cpu_us (this process)
//   <- stop                   stop the workers and exit
//
// Errors go to stderr, with a non-zero exit. The Go side checks the
// database itself after the exit (bench/peers.go).
'use strict'

const readline = require('node:readline')
const { Pool } = require('pg')

// appName is the application_name the Go side's connection monitor counts.
const appName = 'bench-system'

function parseArgs (argv) {
  const opts = { peer: argv[0], items: 0, jobs: 24, batch: 500, workers: 4, url: '' }
  for (let i = 1; i < argv.length; i += 2) {
    const name = argv[i]
    const value = argv[i + 1]
    if (value === undefined) throw new Error(`flag ${name} has no value`)
    switch (name) {
      case '--url': opts.url = value; break
      case '--items': opts.items = Number(value); break
      case '--jobs': opts.jobs = Number(value); break
      case '--batch': opts.batch = Number(value); break
      case '--workers': opts.workers = Number(value); break
      default: throw new Error(`unknown flag ${name}`)
    }
  }
  if (opts.peer !== 'graphile' && opts.peer !== 'pgboss') throw new Error(`unknown peer ${JSON.stringify(opts.peer)} (want graphile or pgboss)`)
  if (!opts.url) throw new Error('--url is required')
  for (const k of ['items', 'jobs', 'batch', 'workers']) {
    if (!Number.isInteger(opts[k]) || opts[k] < 1) throw new Error(`--${k} must be a positive integer`)
  }
  return opts
}

// withAppName returns url with the application_name of the measured systems.
function withAppName (url) {
  const u = new URL(url)
  u.searchParams.set('application_name', appName)
  return u.toString()
}

function send (obj) {
  process.stdout.write(JSON.stringify(obj) + '\n')
}

// commands yields the words the Go side writes on stdin.
function commands () {
  const rl = readline.createInterface({ input: process.stdin })
  const it = rl[Symbol.asyncIterator]()
  return async function next (want) {
    const { value, done } = await it.next()
    if (done) throw new Error(`stdin closed while waiting for ${want}`)
    if (value.trim() !== want) throw new Error(`got ${JSON.stringify(value)} while waiting for ${want}`)
  }
}

// fail ends the process at once: a job that failed would be retried after
// its backoff and the drain would not end until the Go side's timeout.
function fail (what, err) {
  process.stderr.write(`peer: ${what}: ${(err && err.stack) || err}\n`)
  process.exit(1)
}

function cpuMicros (since) {
  const u = process.cpuUsage(since)
  return u.user + u.system
}

// sleep waits ms milliseconds.
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

// graphile drains with graphile-worker in the shape its performance page
// documents for throughput: a local queue of 500 jobs fetched in one
// statement, completions batched (completeJobBatchDelay 0), 24 concurrent
// jobs, a pool of 25. Its completion deletes the job; a task cannot add its
// own statements to that transaction, so no result row: at least once.
async function graphile (opts, next) {
  const { run, makeWorkerUtils, Logger } = require('graphile-worker')
  const quiet = new Logger(() => (level, message) => {
    if (level === 'error') process.stderr.write(`graphile-worker: ${message}\n`)
  })
  const connectionString = withAppName(opts.url)
  const utils = await makeWorkerUtils({ connectionString, logger: quiet })
  await utils.migrate()
  const setup = new Pool({ connectionString: opts.url, max: 1 })
  await setup.query('DELETE FROM graphile_worker._private_jobs')
  for (let done = 0; done < opts.items;) {
    const n = Math.min(5000, opts.items - done)
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: 'noop', payload: {} })))
    done += n
  }
  await setup.query('ANALYZE graphile_worker._private_jobs')
  await utils.release()
  send({ ready: true, peer: 'graphile-worker', version: require('graphile-worker/package.json').version })

  await next('go')
  const cpu0 = process.cpuUsage()
  const start = process.hrtime.bigint()
  let handled = 0
  const runner = await run({
    connectionString,
    concurrency: opts.jobs,
    maxPoolSize: opts.jobs + 1,
    pollInterval: 2000,
    noHandleSignals: true,
    logger: quiet,
    taskList: { noop: async () => { handled++ } },
    preset: { worker: { localQueue: { size: opts.batch }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } }
  })
  runner.events.on('job:error', ({ error }) => fail('a graphile-worker job failed', error))
  runner.promise.catch(err => fail('graphile-worker stopped', err))
  // The completions are batched: the last handler's return is not the last
  // commit. Once every job was handled, wait for the table to empty.
  while (handled < opts.items) await sleep(1)
  for (;;) {
    const { rows } = await setup.query('SELECT count(*)::int AS n FROM graphile_worker._private_jobs')
    if (rows[0].n === 0) break
    await sleep(1)
  }
  const elapsed = Number(process.hrtime.bigint() - start) / 1e6
  send({ done: true, elapsed_ms: elapsed, handled, cpu_us: cpuMicros(cpu0) })
  await next('stop')
  await runner.stop()
  await setup.end()
}

// pgboss drains with pg-boss: --workers work() loops (each call to work()
// adds one, its documented way to more concurrency), each fetching --batch
// jobs per statement. Each batch's handler writes the jobs' result rows and
// completes them in one transaction of its own (pg-boss's complete() takes a
// db option that runs its statement on the caller's connection), so a
// completion carries its results; work() then completes the batch again,
// which finds no active job (one more statement per batch). The handler
// wakes its loop after a full batch (notifyWorker), instead of waiting for
// the polling interval (at least 0.5 s in pg-boss 10).
async function pgboss (opts, next) {
  const PgBoss = require('pg-boss')
  const queue = 'bench_noop'
  const boss = new PgBoss({
    connectionString: opts.url,
    application_name: appName,
    max: opts.workers + 2,
    supervise: false, // no maintenance during a drain of seconds
    schedule: false // no cron
  })
  boss.on('error', err => process.stderr.write(`pg-boss: ${err.stack || err}\n`))
  await boss.start()
  const pool = new Pool({ connectionString: withAppName(opts.url), max: opts.workers })
  await pool.query('CREATE TABLE IF NOT EXISTS bench_pgboss_results (job_id UUID PRIMARY KEY, done_at TIMESTAMPTZ NOT NULL DEFAULT now())')
  await pool.query('TRUNCATE bench_pgboss_results')
  if (!await boss.getQueue(queue)) await boss.createQueue(queue)
  await pool.query('DELETE FROM pgboss.job WHERE name = $1', [queue])
  for (let done = 0; done < opts.items;) {
    const n = Math.min(5000, opts.items - done)
    await boss.insert(Array.from({ length: n }, () => ({ name: queue, data: {} })))
    done += n
  }
  await pool.query('ANALYZE pgboss.job')
  send({ ready: true, peer: 'pg-boss', version: require('pg-boss/package.json').version })

  await next('go')
  const cpu0 = process.cpuUsage()
  const start = process.hrtime.bigint()
  let handled = 0
  let finished
  const allDone = new Promise(resolve => { finished = resolve })
  for (let i = 0; i < opts.workers; i++) {
    let id = null
    id = await boss.work(queue, { batchSize: opts.batch, pollingIntervalSeconds: 0.5 }, async jobs => {
      const ids = jobs.map(j => j.id)
      const client = await pool.connect()
      try {
        await client.query('BEGIN')
        await client.query('INSERT INTO bench_pgboss_results (job_id) SELECT unnest($1::uuid[])', [ids])
        const db = { executeSql: (text, values) => client.query(text, values) }
        const res = await boss.complete(queue, ids, null, { db })
        if (res.affected !== ids.length) throw new Error(`completed ${res.affected} of ${ids.length} jobs`)
        await client.query('COMMIT')
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {})
        fail('a pg-boss batch failed', err)
      } finally {
        client.release()
      }
      handled += jobs.length
      if (handled >= opts.items) finished()
      if (jobs.length === opts.batch && id !== null) boss.notifyWorker(id)
    })
  }
  await allDone
  const elapsed = Number(process.hrtime.bigint() - start) / 1e6
  send({ done: true, elapsed_ms: elapsed, handled, cpu_us: cpuMicros(cpu0) })
  await next('stop')
  await boss.offWork(queue)
  await boss.stop({ graceful: true, wait: true, timeout: 10000 })
  await pool.end()
}

async function main () {
  const opts = parseArgs(process.argv.slice(2))
  const next = commands()
  if (opts.peer === 'graphile') await graphile(opts, next)
  else await pgboss(opts, next)
  process.exit(0)
}

main().catch(err => {
  process.stderr.write(`peer: ${err.stack || err}\n`)
  process.exit(1)
})
