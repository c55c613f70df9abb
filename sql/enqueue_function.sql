-- crdbwork_enqueue: enqueue an item from SQL (psql, Python, Node, any
-- client), with the validation and deduplication of the Go API's
-- claim.Queue.Enqueue. PostgreSQL form (PL/pgSQL); the CockroachDB form is
-- sql/cockroach_enqueue_function.sql, this same function without the lines
-- marked "postgres only". Package sql's Apply installs the engine's form;
-- by hand (default table names):
--   psql -v ON_ERROR_STOP=1 -f sql/enqueue_function.sql "$DATABASE_URL"
-- Documented in docs/enqueue-from-sql.md. Call it in the caller's own
-- transaction to enqueue atomically with other writes:
--   SELECT * FROM crdbwork_enqueue('mail', convert_to('{"to":"ada"}', 'UTF8'));
--   SELECT * FROM crdbwork_enqueue('mail', '\x01'::BYTEA, key => 'user-7', delay => INTERVAL '5 minutes');
-- It returns the item's id, whether this call added it, and whether its id
-- ended in the queue within the dedup window (then nothing was added).
--
-- Every column below is qualified by its table's alias and every value is
-- a v_ variable: PL/pgSQL refuses names that could be a column or a
-- parameter. Written in the subset of PL/pgSQL that CockroachDB accepts
-- (no nested blocks, no FOR loops, no CASE statements, no PERFORM, no
-- GET DIAGNOSTICS, no FOUND, no RECORD variables, no STRICT INTO).
CREATE OR REPLACE FUNCTION crdbwork_enqueue(
    queue        TEXT,
    payload      BYTEA,
    id           UUID        DEFAULT NULL,
    key          TEXT        DEFAULT NULL,
    priority     BIGINT      DEFAULT 0,
    delay        INTERVAL    DEFAULT NULL,
    run_at       TIMESTAMPTZ DEFAULT NULL,
    max_attempts BIGINT      DEFAULT NULL,
    tenant       TEXT        DEFAULT NULL,
    ttl          INTERVAL    DEFAULT NULL,
    metadata     BYTEA       DEFAULT NULL,
    headers      JSONB       DEFAULT NULL,
    at_most_once BOOL        DEFAULT false,
    timeout      INTERVAL    DEFAULT NULL,
    kind         TEXT        DEFAULT NULL,
    after        UUID[]      DEFAULT NULL,
    run_after    TEXT[]      DEFAULT NULL,
    after_queues TEXT[]      DEFAULT NULL,
    OUT item_id  UUID,
    OUT added    BOOL,
    OUT done     BOOL)
LANGUAGE plpgsql VOLATILE AS $crdbwork$
DECLARE
    v_queue    TEXT;
    v_payload  BYTEA;
    v_id       UUID;
    v_key      TEXT;
    v_tenant   TEXT;
    v_priority BIGINT;
    v_delay_us BIGINT;
    v_ttl_us   BIGINT;
    v_tmo_us   BIGINT;
    v_max      BIGINT;
    v_metadata BYTEA;
    v_headers  JSONB;
    v_kind     TEXT;
    v_amo      BOOL;
    v_bytes    BYTEA;
    v_n        BIGINT;
    v_i        BIGINT;
    v_hi       BIGINT;
    v_lo       BIGINT;
    v_t        BIGINT;
    v_hash     BIGINT;
    v_turn     TIMESTAMPTZ;
    v_head     TIMESTAMPTZ;
    v_last     TIMESTAMPTZ;
    v_got      UUID;
    v_other    TEXT;
    v_ended    BOOL;
    v_seq      BIGINT;
    v_revision TEXT;
    v_nafter   BIGINT;
    v_ra       BIGINT;
    v_pre      UUID;
    v_state    TEXT;
    v_ps       UUID[];
    v_sts      TEXT[];
    v_pend     UUID[];
    v_qs       TEXT[];
    v_pendq    TEXT[];
    v_nq       BIGINT;
    v_aq       TEXT[];
    v_win      INTERVAL;
    v_wait     BOOL;
BEGIN
    -- This function's revision (package sql's Apply reads it back from the
    -- catalog, and replaces the function only if it is older).
    v_revision := 'crdbwork-enqueue-revision-4';

    -- Validation, as claim.Queue.Enqueue's (the limits are its defaults):
    -- nothing is written when an argument is refused.
    IF queue IS NULL OR queue = '' THEN
        RAISE EXCEPTION 'enqueue: the queue name is required (the Go API''s default queue is named ''default'')'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(payload) > 1048576 THEN
        RAISE EXCEPTION 'enqueue: the payload is % bytes, the limit is 1048576 (store large data elsewhere and enqueue a reference)',
            octet_length(payload) USING ERRCODE = '54000';
    END IF;
    IF octet_length(metadata) > 1048576 THEN
        RAISE EXCEPTION 'enqueue: the metadata is % bytes, the limit is 1048576', octet_length(metadata) USING ERRCODE = '54000';
    END IF;
    -- The texts that the items' indexes hold: their bounds are the Go
    -- API's (package sql's MaxQueueNameLength and MaxKeyLength), which
    -- keep every index entry within PostgreSQL's bound of 2,704 bytes.
    IF octet_length(queue) > 512 THEN
        RAISE EXCEPTION 'enqueue: the queue name is % bytes, the limit is 512', octet_length(queue) USING ERRCODE = '22023';
    END IF;
    IF octet_length(key) > 2048 THEN
        RAISE EXCEPTION 'enqueue: the key is % bytes, the limit is 2048', octet_length(key) USING ERRCODE = '22023';
    END IF;
    IF octet_length(tenant) > 2048 THEN
        RAISE EXCEPTION 'enqueue: the tenant is % bytes, the limit is 2048', octet_length(tenant) USING ERRCODE = '22023';
    END IF;
    IF delay IS NOT NULL AND run_at IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue: give delay or run_at, not both' USING ERRCODE = '22023';
    END IF;
    IF delay < INTERVAL '0 seconds' THEN
        RAISE EXCEPTION 'enqueue: negative delay %', delay USING ERRCODE = '22023';
    END IF;
    IF max_attempts < 0 THEN
        RAISE EXCEPTION 'enqueue: negative max_attempts %', max_attempts USING ERRCODE = '22023';
    END IF;
    IF timeout IS NOT NULL AND (timeout < INTERVAL '1 millisecond' OR timeout > INTERVAL '8760 hours') THEN
        RAISE EXCEPTION 'enqueue: timeout % must be NULL (the worker''s ItemTimeout) or between 1 millisecond and 8760 hours', timeout USING ERRCODE = '22023';
    END IF;
    IF ttl < INTERVAL '0 seconds' OR ttl > INTERVAL '8760 hours' THEN
        RAISE EXCEPTION 'enqueue: ttl % must be between 0 (none) and 8760 hours', ttl USING ERRCODE = '22023';
    END IF;
    IF priority IS NULL THEN
        RAISE EXCEPTION 'enqueue: priority must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF octet_length(kind) > 255 THEN
        RAISE EXCEPTION 'enqueue: the kind is % bytes, the limit is 255', octet_length(kind) USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'enqueue: headers must be a JSON object of strings, not %', jsonb_typeof(headers) USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND EXISTS (SELECT 1 FROM jsonb_each(headers) AS h (k, v) WHERE h.k = '' OR jsonb_typeof(h.v) <> 'string') THEN
        RAISE EXCEPTION 'enqueue: headers must be a JSON object of strings with non-empty names' USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND (SELECT COALESCE(sum(octet_length(h.k) + octet_length(h.v)), 0) FROM jsonb_each_text(headers) AS h (k, v)) > 16384 THEN
        RAISE EXCEPTION 'enqueue: the headers are over 16384 bytes' USING ERRCODE = '22023';
    END IF;
    -- Prerequisites (claim.NewItem.After and RunAfter), checked as Go
    -- checks them: at most 10,000, none NULL or the zero id, none listed
    -- twice, not the item itself; run_after names the ends 'died' and
    -- 'cancelled' of a prerequisite after which the item runs anyway.
    v_nafter := COALESCE(array_length(after, 1), 0);
    IF v_nafter > 10000 THEN
        RAISE EXCEPTION 'enqueue: % prerequisites, the limit is 10000', v_nafter USING ERRCODE = '22023';
    END IF;
    IF v_nafter > 0 AND EXISTS (SELECT 1 FROM unnest(after) AS a (p) WHERE a.p IS NULL OR a.p = '00000000-0000-0000-0000-000000000000'::UUID) THEN
        RAISE EXCEPTION 'enqueue: a prerequisite is NULL or the zero id' USING ERRCODE = '22023';
    END IF;
    -- after_queues[i] names the queue of after[i] (claim.NewItem.AfterIn);
    -- NULL or '' (or no after_queues): the item's own queue.
    v_nq := COALESCE(array_length(after_queues, 1), 0);
    IF v_nq > 0 AND v_nq <> v_nafter THEN
        RAISE EXCEPTION 'enqueue: after_queues has % queues for % prerequisites: one per prerequisite (NULL: the item''s queue)', v_nq, v_nafter
            USING ERRCODE = '22023';
    END IF;
    IF v_nq > 0 AND EXISTS (SELECT 1 FROM unnest(after_queues) AS a (q) WHERE octet_length(a.q) > 512) THEN
        RAISE EXCEPTION 'enqueue: a queue name of after_queues is over 512 bytes' USING ERRCODE = '22023';
    END IF;
    -- One queue (or NULL) per prerequisite, so that the two arrays unnest
    -- side by side without relying on how an engine pads a NULL array.
    v_aq := after_queues;
    IF v_nq = 0 AND v_nafter > 0 THEN
        SELECT array_agg(NULL::TEXT) INTO v_aq FROM unnest(after) AS a (p);
    END IF;
    IF v_nafter > 0 THEN
        SELECT a.p INTO v_pre FROM unnest(after, v_aq) AS a (p, q)
            GROUP BY a.p, COALESCE(NULLIF(a.q, ''), queue) HAVING count(*) > 1 ORDER BY a.p LIMIT 1;
        IF v_pre IS NOT NULL THEN
            RAISE EXCEPTION 'enqueue: prerequisite % is listed twice', v_pre USING ERRCODE = '22023';
        END IF;
    END IF;
    IF id IS NOT NULL AND v_nafter > 0 AND id = ANY(after) THEN
        RAISE EXCEPTION 'enqueue: the item waits for itself (%)', id USING ERRCODE = '22023';
    END IF;
    IF run_after IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(run_after) AS r (e) WHERE r.e IS NULL OR r.e NOT IN ('died', 'cancelled')) THEN
        RAISE EXCEPTION 'enqueue: run_after takes the ends ''died'' and ''cancelled'' of a prerequisite, not %', run_after::TEXT USING ERRCODE = '22023';
    END IF;
    IF COALESCE(array_length(run_after, 1), 0) > 0 AND v_nafter = 0 THEN
        RAISE EXCEPTION 'enqueue: run_after without after: the item has no prerequisite to run after' USING ERRCODE = '22023';
    END IF;
    v_ra := 0;
    IF run_after IS NOT NULL AND 'died' = ANY(run_after) THEN
        v_ra := v_ra | 1; -- internal/store.RunAfterDead
    END IF;
    IF run_after IS NOT NULL AND 'cancelled' = ANY(run_after) THEN
        v_ra := v_ra | 2; -- internal/store.RunAfterCancelled
    END IF;

    v_queue := queue;
    v_payload := COALESCE(payload, ''::BYTEA);
    v_id := COALESCE(id, gen_random_uuid());
    v_key := NULLIF(key, '');
    v_tenant := NULLIF(tenant, '');
    v_priority := priority;
    v_amo := COALESCE(at_most_once, false);
    v_kind := NULLIF(kind, '');
    v_metadata := metadata;
    v_headers := headers;
    IF v_headers = '{}'::JSONB THEN
        v_headers := NULL;
    END IF;
    v_max := COALESCE(NULLIF(max_attempts, 0), 25);
    -- Durations in microseconds, as the Go API sends them.
    v_delay_us := 0;
    IF delay IS NOT NULL THEN
        v_delay_us := (EXTRACT(EPOCH FROM delay) * 1000000)::BIGINT;
    END IF;
    IF run_at IS NOT NULL THEN
        v_delay_us := GREATEST((EXTRACT(EPOCH FROM run_at - now()) * 1000000)::BIGINT, 0);
    END IF;
    v_tmo_us := NULL;
    IF timeout IS NOT NULL THEN
        v_tmo_us := (EXTRACT(EPOCH FROM timeout) * 1000000)::BIGINT;
    END IF;
    v_ttl_us := 0;
    IF ttl IS NOT NULL THEN
        v_ttl_us := (EXTRACT(EPOCH FROM ttl) * 1000000)::BIGINT;
    END IF;

    -- The part: the key's hash (or, without a key, the tenant's) modulo
    -- the queue's parts, with the Go API's hash (64-bit FNV-1a of the
    -- UTF-8 bytes, its top bit cleared), so that SQL and Go put a key in
    -- the same part. Computed in two 32-bit halves: BIGINT arithmetic
    -- must not overflow. Without either, a random part.
    IF v_key IS NOT NULL OR v_tenant IS NOT NULL THEN
        v_bytes := convert_to(COALESCE(v_key, v_tenant), 'UTF8');
        v_n := octet_length(v_bytes);
        v_hi := 3421674724; -- the offset basis 0xcbf29ce484222325
        v_lo := 2216829733;
        v_i := 0;
        WHILE v_i < v_n LOOP
            v_lo := v_lo # get_byte(v_bytes, v_i::INT);
            -- times the prime 2^40 + 435, modulo 2^64
            v_t := v_lo * 435;
            v_hi := ((v_hi * 435) + (v_t >> 32) + ((v_lo & 16777215) << 8)) & 4294967295;
            v_lo := v_t & 4294967295;
            v_i := v_i + 1;
        END LOOP;
        v_hash := ((v_hi & 2147483647) << 32) | v_lo;
    ELSE
        v_hash := floor(random() * 4294967296)::BIGINT;
    END IF;

    -- A fair queue's turn (claim's stamp): after the tenant's latest
    -- unclaimed turn of this priority, never before the priority's head.
    v_turn := NULL;
    IF v_tenant IS NOT NULL AND EXISTS (SELECT 1 FROM crdbwork_queues AS q WHERE q.name = v_queue AND q.fair) THEN
        v_turn := now();
        SELECT x.turn_at INTO v_head FROM crdbwork_items AS x
            WHERE x.queue = v_queue AND x.priority = v_priority AND x.claim IS NULL ORDER BY x.turn_at LIMIT 1;
        IF v_head IS NOT NULL AND v_head < v_turn THEN
            v_turn := v_head;
        END IF;
        SELECT x.turn_at INTO v_last FROM crdbwork_items AS x
            WHERE x.queue = v_queue AND x.tenant = v_tenant AND x.priority = v_priority AND x.claim IS NULL
            ORDER BY x.turn_at DESC LIMIT 1;
        IF v_last IS NOT NULL AND v_last >= v_turn THEN
            v_turn := v_last + INTERVAL '1 microsecond';
        END IF;
    END IF;

    -- A sequenced queue's order (docs/sequences.md): claims take a key's
    -- items in (enqueued_at, seq_order, id) order, and enqueued_at is the
    -- transaction's now(), the same for every call of one transaction. So
    -- the order is one more than the highest of the key's sequenced items
    -- enqueued at this now(): within one transaction successive calls keep
    -- their order (each sees the rows of the calls before it, and of Go
    -- enqueues of the same transaction before it), whatever the clock's
    -- resolution; another transaction has another now(), which orders it.
    -- One seek of crdbwork_items_sequence_order (queue, item_key,
    -- enqueued_at, seq_order, id). Stored only if the queue is sequenced,
    -- read by the insert below as the Go enqueue reads it.
    v_seq := NULL;
    IF v_key IS NOT NULL THEN
        SELECT x.seq_order + 1 INTO v_seq FROM crdbwork_items AS x
            WHERE x.queue = v_queue AND x.item_key = v_key AND x.enqueued_at = now() AND x.seq_order IS NOT NULL
            ORDER BY x.seq_order DESC LIMIT 1;
        v_seq := COALESCE(v_seq, 0);
    END IF;

    -- Prerequisites (docs/dependencies.md), as claim.Queue.Enqueue's
    -- writeDeps: an id already queued or waiting, or ended in the queue
    -- within its window, is answered by the insert below (a duplicate, or
    -- done) whatever its prerequisites became since, so a retry after an
    -- unknown outcome answers what became of its item. Otherwise each
    -- prerequisite is classified in its queue (after_queues, or this one)
    -- in one read (a seek by id in each table): queued or waiting there is
    -- pending, acked or taken is satisfied, dead or cancelled is satisfied
    -- only if run_after names that end (else the call fails), an item of
    -- yet another queue or unknown fails the call. With pending
    -- prerequisites the item is a waiting item (crdbwork_waiting, outside
    -- the items table: no claim sees it) with one edge per pending
    -- prerequisite (in crdbwork_waits_for, or for one of another queue in
    -- crdbwork_waits_across with its hint, as internal/store's
    -- InsertAcross), released by the ack of the last one; with none it is
    -- an ordinary item, claimable at once.
    v_wait := false;
    IF v_nafter > 0
       AND NOT EXISTS (SELECT 1 FROM crdbwork_items AS x WHERE x.id = v_id)
       AND NOT EXISTS (SELECT 1 FROM crdbwork_waiting AS w WHERE w.id = v_id)
       AND NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e
           WHERE e.queue = v_queue AND e.id = v_id
             AND e.ended_at > now() - COALESCE((SELECT q.dedup_window FROM crdbwork_queues AS q WHERE q.name = v_queue), INTERVAL '24 hours')) THEN
        -- The memory of ended ids of each prerequisite's queue is how a
        -- prerequisite acked without releasing its dependents at once is
        -- told from one that died (claim.ErrNoDedupWindow).
        SELECT q.name INTO v_other FROM crdbwork_queues AS q
            WHERE q.name IN (SELECT COALESCE(NULLIF(a.q, ''), v_queue) FROM unnest(after, v_aq) AS a (p, q))
              AND q.dedup_window <= INTERVAL '0 seconds'
            ORDER BY q.name LIMIT 1;
        IF v_other IS NOT NULL THEN
            RAISE EXCEPTION 'enqueue: dependencies need the queue''s dedup window above zero (queue %: dedup window off)', v_other
                USING ERRCODE = '55000';
        END IF;
        SELECT array_agg(c.p ORDER BY c.n), array_agg(c.q ORDER BY c.n),
               array_agg(CASE WHEN c.iq IS NOT NULL AND c.iq <> c.q THEN 'other:' || c.iq
                              WHEN c.wq IS NOT NULL AND c.wq <> c.q THEN 'other:' || c.wq
                              WHEN c.iq IS NOT NULL OR c.wq IS NOT NULL THEN 'pending'
                              WHEN c.outcome IS NOT NULL THEN c.outcome
                              WHEN c.dead THEN 'dead'
                              ELSE 'unknown' END ORDER BY c.n)
            INTO v_ps, v_qs, v_sts
        FROM (SELECT a.p, a.n, a.q,
                     (SELECT i.queue FROM crdbwork_items AS i WHERE i.id = a.p) AS iq,
                     (SELECT w.queue FROM crdbwork_waiting AS w WHERE w.id = a.p) AS wq,
                     (SELECT e.outcome FROM crdbwork_ended AS e WHERE e.queue = a.q AND e.id = a.p) AS outcome,
                     EXISTS (SELECT 1 FROM crdbwork_dead_items AS d WHERE d.id = a.p AND d.queue = a.q) AS dead
              FROM (SELECT u.p, u.n, COALESCE(NULLIF(u.q, ''), v_queue) AS q
                    FROM unnest(after, v_aq) WITH ORDINALITY AS u (p, q, n)) AS a) AS c;
        SELECT u.p, u.q, u.st INTO v_pre, v_other, v_state FROM unnest(v_ps, v_qs, v_sts) WITH ORDINALITY AS u (p, q, st, n)
            WHERE u.st LIKE 'other:%' ORDER BY u.n LIMIT 1;
        IF v_pre IS NOT NULL THEN
            RAISE EXCEPTION 'enqueue: prerequisite % is an item of queue %, not of queue % (claim.ErrPrerequisiteOtherQueue; name its queue in after_queues)',
                v_pre, substr(v_state, 7), v_other USING ERRCODE = '23503';
        END IF;
        SELECT u.p, u.q, u.st INTO v_pre, v_other, v_state FROM unnest(v_ps, v_qs, v_sts) WITH ORDINALITY AS u (p, q, st, n)
            WHERE u.st = 'unknown' OR (u.st = 'dead' AND (v_ra & 1) = 0) OR (u.st = 'cancelled' AND (v_ra & 2) = 0)
            ORDER BY u.n LIMIT 1;
        IF v_state = 'unknown' THEN
            RAISE EXCEPTION 'enqueue: prerequisite % is unknown: not queued, waiting, or ended in queue % within its dedup window (claim.ErrPrerequisiteUnknown)',
                v_pre, v_other USING ERRCODE = '23503';
        END IF;
        IF v_pre IS NOT NULL THEN
            RAISE EXCEPTION 'enqueue: prerequisite % of queue % ended without an ack (%): the item could never run; run_after ARRAY[''died'', ''cancelled''] runs it anyway (claim.ErrPrerequisiteDied)',
                v_pre, v_other, v_state USING ERRCODE = '55000';
        END IF;
        SELECT COALESCE(array_agg(u.p ORDER BY u.n), ARRAY[]::UUID[]), COALESCE(array_agg(u.q ORDER BY u.n), ARRAY[]::TEXT[]) INTO v_pend, v_pendq
            FROM unnest(v_ps, v_qs, v_sts) WITH ORDINALITY AS u (p, q, st, n) WHERE u.st = 'pending';
        IF array_length(v_pend, 1) > 0 THEN
            v_wait := true;
            -- The waiting item (dependsStatements.InsertWaiting): what its
            -- move into the items table needs, the part computed then.
            INSERT INTO crdbwork_waiting AS w
                (id, queue, hash, item_key, priority, delay_us, max_attempts, payload, metadata, tenant, ttl_us, at_most_once,
                 remaining, headers, seq_order, run_after, timeout_us, kind)
            SELECT v_id, v_queue, v_hash, v_key, v_priority, v_delay_us, v_max, v_payload, v_metadata, v_tenant, v_ttl_us, v_amo,
                   array_length(v_pend, 1), v_headers, CASE WHEN n.seq AND v_key IS NOT NULL THEN v_seq END, v_ra, v_tmo_us, v_kind
            FROM (SELECT COALESCE((SELECT q.sequenced FROM crdbwork_queues AS q WHERE q.name = v_queue), false) AS seq) AS n
            WHERE NOT EXISTS (SELECT 1 FROM crdbwork_items AS x WHERE x.id = v_id)
              AND NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = v_queue AND e.id = v_id
                  AND e.ended_at > now() - COALESCE((SELECT q.dedup_window FROM crdbwork_queues AS q WHERE q.name = v_queue), INTERVAL '24 hours'))
            ON CONFLICT DO NOTHING
            RETURNING w.id INTO v_got;
            IF v_got IS NOT NULL THEN
                INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
                SELECT u.q, u.p, v_id FROM unnest(v_pend, v_pendq) AS u (p, q)
                ON CONFLICT DO NOTHING;
                INSERT INTO crdbwork_waits_across (prereq_queue, prereq, dependent_queue, dependent)
                SELECT u.q, u.p, v_queue, v_id FROM unnest(v_pend, v_pendq) AS u (p, q) WHERE u.q <> v_queue
                ON CONFLICT DO NOTHING;
            END IF;
        END IF;
    END IF;

    -- The insert of claim's enqueue (sql/enqueue.go, Insert and
    -- PostgresInsert): the part under a share lock on the queue's row,
    -- nothing if the id is in the items table or ended in the queue
    -- within its dedup window.
    IF NOT v_wait THEN
    INSERT INTO crdbwork_items AS i
        (id, queue, part, item_key, priority, vesting_at, max_attempts, payload, metadata,
         tenant, turn_at, expires_at, at_most_once, headers, seq_order, timeout_us, kind)
    SELECT v_id, v_queue, v_hash % n.parts, v_key, v_priority, now() + v_delay_us * INTERVAL '1 microsecond',
           CASE WHEN v_amo OR n.amo THEN 1 ELSE v_max END, v_payload, v_metadata, v_tenant,
           CASE WHEN v_turn IS NULL THEN now() + v_delay_us * INTERVAL '1 microsecond'
                WHEN v_delay_us > 0 THEN GREATEST(v_turn, now() + v_delay_us * INTERVAL '1 microsecond')
                ELSE v_turn END,
           CASE WHEN v_ttl_us > 0 THEN now() + v_ttl_us * INTERVAL '1 microsecond' END,
           v_amo OR n.amo, v_headers, CASE WHEN n.seq AND v_key IS NOT NULL THEN v_seq END, v_tmo_us, v_kind
    FROM (SELECT COALESCE((SELECT q.num_parts FROM crdbwork_queues AS q WHERE q.name = v_queue FOR SHARE), 1) AS parts,
                 COALESCE((SELECT q.at_most_once FROM crdbwork_queues AS q WHERE q.name = v_queue), false) AS amo,
                 COALESCE((SELECT q.dedup_window FROM crdbwork_queues AS q WHERE q.name = v_queue), INTERVAL '24 hours') AS win,
                 COALESCE((SELECT q.sequenced FROM crdbwork_queues AS q WHERE q.name = v_queue), false) AS seq) AS n
    WHERE NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = v_queue AND e.id = v_id AND e.ended_at > now() - n.win)
      AND NOT EXISTS (SELECT 1 FROM crdbwork_waiting AS w WHERE w.id = v_id)
      AND NOT EXISTS (SELECT 1 FROM crdbwork_items AS x WHERE x.id = v_id FOR KEY SHARE OF x) -- postgres only
    ON CONFLICT DO NOTHING
    RETURNING i.id INTO v_got;
    END IF;

    -- Is the id ended in the queue within its window? Under READ
    -- COMMITTED (PostgreSQL's default) this statement sees an ack of the
    -- same id that committed while the insert waited for the acked row:
    -- the insert's own check could not, and the copy it added is taken
    -- back. (Under SERIALIZABLE the insert's locking read fails with a
    -- serialization error instead, to be retried.)
    SELECT EXISTS (SELECT 1 FROM crdbwork_ended AS e
        WHERE e.queue = v_queue AND e.id = v_id
          AND e.ended_at > now() - COALESCE((SELECT q.dedup_window FROM crdbwork_queues AS q WHERE q.name = v_queue), INTERVAL '24 hours'))
        INTO v_ended;
    IF v_got IS NOT NULL AND v_ended AND v_wait THEN
        DELETE FROM crdbwork_waits_for AS f WHERE f.dependent = v_got
            AND f.queue IN (SELECT COALESCE(NULLIF(a.q, ''), v_queue) FROM unnest(after, v_aq) AS a (p, q));
        DELETE FROM crdbwork_waits_across AS f WHERE f.dependent_queue = v_queue AND f.dependent = v_got;
        DELETE FROM crdbwork_waiting AS w WHERE w.id = v_got;
        v_got := NULL;
    END IF;
    IF v_got IS NOT NULL AND v_ended THEN
        DELETE FROM crdbwork_items AS x WHERE x.id = v_got;
        v_got := NULL;
    END IF;

    v_other := NULL;
    IF v_got IS NULL THEN
        SELECT x.queue INTO v_other FROM crdbwork_items AS x WHERE x.id = v_id;
        IF v_other IS NULL THEN
            SELECT w.queue INTO v_other FROM crdbwork_waiting AS w WHERE w.id = v_id;
        END IF;
        IF v_other IS NOT NULL AND v_other <> v_queue THEN
            RAISE EXCEPTION 'enqueue: id % is an item of queue %', v_id, v_other USING ERRCODE = '23505';
        END IF;
    ELSIF v_delay_us = 0 AND NOT v_wait THEN -- postgres only
        -- Wake idle workers of every process at commit (sql.Store.NotifyChannel). -- postgres only
        PERFORM pg_notify('crdbwork_' || left(encode(sha256(convert_to('0:|0:|' || octet_length(v_queue)::TEXT || ':' || v_queue, 'UTF8')), 'hex'), 32), ''); -- postgres only
    END IF;

    item_id := v_id;
    added := v_got IS NOT NULL;
    done := v_got IS NULL AND v_other IS NULL AND v_ended;
END
$crdbwork$;
