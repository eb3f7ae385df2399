-- highwater's PostgreSQL store, schema version 6: the API limits a job learnt from
-- refusals (see src/quota/kept.rs and src/store/postgres/learned.rs).

-- The windows nobody announced that the job's workers learnt from the API's 429s: a JSON
-- array of kept limits (the fleet's calls per window, its length, when its window ends,
-- the refusals it was learnt from, when it changed). Every worker merges its own in and
-- paces by all of them.
ALTER TABLE hw_job ADD COLUMN learned_limits jsonb NOT NULL DEFAULT '[]';
