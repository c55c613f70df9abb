-- CockroachDB-only settings for the crdbwork schema. Apply after schema.sql:
--   cockroach sql --url "$DATABASE_URL" --file sql/cockroach.sql
-- PostgreSQL has no twin for these statements and needs none: its VACUUM
-- reclaims the dead rows that heartbeats, claims and acks leave behind.
--
-- Heartbeats rewrite session rows every second and every ack deletes an item,
-- so these tables collect MVCC garbage quickly. A short garbage-collection
-- TTL keeps scans of them fast. Idempotent.
ALTER TABLE crdbwork_sessions CONFIGURE ZONE USING gc.ttlseconds = 600;
ALTER TABLE crdbwork_session_parts CONFIGURE ZONE USING gc.ttlseconds = 600;
ALTER TABLE crdbwork_items CONFIGURE ZONE USING gc.ttlseconds = 600;
