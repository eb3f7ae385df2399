-- highwater's PostgreSQL store, schema version 1 (see src/store/postgres/mod.rs).
-- Applied by highwater itself (src/store/postgres/migrate.rs), in one transaction under an
-- advisory lock, and recorded with this file's sha256 in hw_schema. Never edit a released
-- migration: add the next file.

-- Every lease (bucket or planner) is granted with a fresh value: tokens only grow.
CREATE SEQUENCE hw_lease_token AS bigint;

CREATE TABLE hw_job (
    job_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name              text NOT NULL UNIQUE,
    -- The job spec as stored: templates as written (${VAR} unexpanded: no secrets).
    spec              jsonb NOT NULL,
    spec_history      jsonb NOT NULL DEFAULT '[]',
    -- The input the job is planned from (highwater's Fingerprint: length, xxh3).
    input_fingerprint jsonb,
    bucket_size       bigint NOT NULL CHECK (bucket_size > 0),
    -- Where the planner stands: the next bucket, where it starts, input read to its end.
    next_bucket       bigint NOT NULL DEFAULT 0,
    cursor_byte       bigint NOT NULL DEFAULT 0,
    cursor_line       bigint NOT NULL DEFAULT 0,
    cursor_row        bigint NOT NULL DEFAULT 0,
    planner_exhausted boolean NOT NULL DEFAULT false,
    -- The planner lease: a worker session and its token; valid while that session lives.
    planner           uuid,
    planner_token     bigint,
    -- The fleet's rate limit (calls/s; NULL: none) and burst, shared by the workers.
    rate_per_s        double precision CHECK (rate_per_s IS NULL OR rate_per_s > 0),
    burst             integer NOT NULL DEFAULT 1 CHECK (burst > 0),
    -- A Retry-After seen by one worker pauses all until then.
    paused_until      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);

-- One row per worker process start. Times are the database's.
CREATE TABLE hw_worker (
    job_id       bigint NOT NULL REFERENCES hw_job ON DELETE CASCADE,
    worker_id    uuid NOT NULL DEFAULT gen_random_uuid(),
    host         text NOT NULL,
    pid          integer NOT NULL,
    version      text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    draining     boolean NOT NULL DEFAULT false,
    -- calls/s granted from the job's rate (NULL: the job has none).
    rate_share   double precision,
    stats        jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (job_id, worker_id)
);

-- One row per bucket of a log: rerun 0 is the job's own log, n > 0 rerun n's.
CREATE TABLE hw_bucket (
    job_id          bigint NOT NULL REFERENCES hw_job ON DELETE CASCADE,
    rerun           integer NOT NULL DEFAULT 0 CHECK (rerun >= 0),
    bucket          bigint NOT NULL CHECK (bucket >= 0),
    state           text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'leased', 'committed')),
    -- The session holding the lease (leased), or that committed it; NULL when open.
    owner           uuid,
    -- The last token granted for this bucket (kept when released: tokens only grow).
    lease_token     bigint,
    -- Times the bucket was leased again after an earlier lease (takeover or release).
    owner_switches  integer NOT NULL DEFAULT 0,
    -- The write-ahead record: highwater's OffsetRecord (or RerunOffset), as JSON.
    offset_record   jsonb NOT NULL,
    items           bigint NOT NULL CHECK (items >= 0),
    -- The commit record's counts, once committed.
    ok              bigint,
    failed          bigint,
    failed_by_class jsonb,
    committed_at    timestamptz,
    PRIMARY KEY (job_id, rerun, bucket),
    CHECK ((state = 'open') = (owner IS NULL)),
    CHECK ((state = 'committed') = (committed_at IS NOT NULL))
);
-- What acquire scans: the uncommitted buckets only.
CREATE INDEX hw_bucket_uncommitted ON hw_bucket (job_id, rerun, bucket) WHERE state <> 'committed';
CREATE INDEX hw_bucket_owner ON hw_bucket (owner) WHERE state = 'leased';

-- One row per unique ID of a job: planned (pending), then its final result.
CREATE TABLE hw_item (
    job_id      bigint NOT NULL REFERENCES hw_job ON DELETE CASCADE,
    id          text NOT NULL,
    -- The job bucket and input row of the ID's first occurrence.
    bucket      bigint NOT NULL,
    "row"       bigint NOT NULL,
    status      text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'ok', 'failed')),
    http_status integer,
    -- The API's answer, byte for byte (json, not jsonb: the export must not reorder it).
    body        json,
    -- The rest of highwater's ItemRecord (error, class, attempts, times, rerun).
    record      jsonb,
    -- The lease token the row was written under; 0: by the planner.
    lease_token bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, id)
);
CREATE INDEX hw_item_bucket ON hw_item (job_id, bucket, "row");

-- Input lines without a usable ID (--skip-bad-lines).
CREATE TABLE hw_bad_line (
    job_id bigint NOT NULL REFERENCES hw_job ON DELETE CASCADE,
    "row"  bigint NOT NULL,
    line   bigint NOT NULL,
    reason text NOT NULL,
    PRIMARY KEY (job_id, "row")
);

-- One row per rerun; its buckets are hw_bucket rows with rerun = number, their IDs in
-- hw_rerun_item.
CREATE TABLE hw_rerun (
    job_id     bigint NOT NULL REFERENCES hw_job ON DELETE CASCADE,
    number     integer NOT NULL CHECK (number > 0),
    selection  jsonb NOT NULL,
    buckets    bigint NOT NULL,
    ids        bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, number)
);

CREATE TABLE hw_rerun_item (
    job_id bigint NOT NULL,
    rerun  integer NOT NULL,
    bucket bigint NOT NULL,
    "row"  bigint NOT NULL,
    id     text NOT NULL,
    PRIMARY KEY (job_id, rerun, bucket, "row"),
    FOREIGN KEY (job_id, rerun) REFERENCES hw_rerun ON DELETE CASCADE
);

-- The results as users query them: select id, body from hw_result where job = 'J' and status = 'ok'.
CREATE VIEW hw_result AS
SELECT j.name AS job, i.id, i.bucket, i."row", i.status, i.http_status, i.body,
       i.record ->> 'error' AS error, i.record ->> 'class' AS class,
       (i.record ->> 'attempts')::integer AS attempts
FROM hw_item i JOIN hw_job j USING (job_id);
