-- highwater's PostgreSQL store, schema version 4: the kept columns of each ID's input row
-- (see src/store/postgres/planner.rs), which the workers' request templates use: they have
-- no input file.

-- The columns as one JSON object, as the planner read them (json, not jsonb: kept as read);
-- NULL when the job keeps no columns.
ALTER TABLE hw_item ADD COLUMN row_values json;
