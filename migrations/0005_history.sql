-- highwater's PostgreSQL store, schema version 5: the job's history (see src/history/ and
-- src/store/postgres/history.rs).

-- One row per record of the history, in the order written: a run's start (its worker, pid
-- and the job's spec, secrets only as ${VAR}) or a sample of a run's figures. Every worker
-- appends its own; past a bound the oldest samples are thinned.
CREATE TABLE hw_history (
    job_id  bigint NOT NULL REFERENCES hw_job ON DELETE CASCADE,
    seq     bigint GENERATED ALWAYS AS IDENTITY,
    sample  boolean NOT NULL,
    record  jsonb NOT NULL,
    PRIMARY KEY (job_id, seq)
);
