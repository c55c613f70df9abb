-- crdbwork schema version 5: running items cancelled from outside, snooze,
-- checkpoints and progress, retention, sequences, dependencies, trace
-- context, enqueue from SQL, and the operators' audit list. Every statement
-- is idempotent; the last one raises the version row. Version-3 and -4 code
-- keeps working on this schema (it serves version 3 and newer).

-- == cancel and snooze ==

-- == checkpoints and progress ==

-- == retention ==

-- == sequences ==

-- == dependencies ==

-- == trace context and enqueue from SQL ==

-- == audit ==

-- Operators' actions (the dashboard's, and destructive crdbwork commands'):
-- who did what to which queue, and when. Read newest first, a page at a time.
CREATE TABLE IF NOT EXISTS crdbwork_audit (
    id      UUID        NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor   TEXT        NOT NULL,
    source  TEXT        NOT NULL,
    action  TEXT        NOT NULL,
    queue   TEXT        NOT NULL DEFAULT '',
    detail  TEXT        NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS crdbwork_audit_by_time ON crdbwork_audit (at, id);

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 5)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
