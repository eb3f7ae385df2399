-- highwater's PostgreSQL store, schema version 2: the fleet's burst shared like its rate, and
-- idle workers giving their rate share back (see src/store/postgres/session.rs).

-- The job's --burst, split among the workers in proportion to their shares; NULL: no --burst
-- was given, each worker derives its burst from its share. Version 1 always wrote 1 here
-- (no --burst was ever stored), so every existing job has none.
ALTER TABLE hw_job ALTER COLUMN burst DROP NOT NULL;
ALTER TABLE hw_job ALTER COLUMN burst DROP DEFAULT;
UPDATE hw_job SET burst = NULL;

-- The worker holds no bucket and found none to lease: it takes no rate share, so the busy
-- workers' fair shares grow.
ALTER TABLE hw_worker ADD COLUMN idle boolean NOT NULL DEFAULT false;
