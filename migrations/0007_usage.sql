-- highwater's PostgreSQL store, schema version 7: what a bucket's calls cost (see
-- src/meter/ and src/store/postgres/results.rs).

-- A committed bucket's usage as its items' answers said: input and output units (a
-- language model's tokens), summed over its IDs with a final result; a rerun's commit moves
-- them as it moves the counts. Zero for buckets committed before it was counted.
ALTER TABLE hw_bucket
    ADD COLUMN usage_input bigint NOT NULL DEFAULT 0,
    ADD COLUMN usage_output bigint NOT NULL DEFAULT 0;
