-- highwater's PostgreSQL store, schema version 3: the job's quota usage, shared by every
-- worker of the fleet (see src/store/postgres/quota.rs).

-- Per quota window (by its key: "2s", "1h,rolling", "job"), the calls reserved in each slot
-- that still counts: highwater's QuotaLedger as JSON. Reserved under the job row's lock.
ALTER TABLE hw_job ADD COLUMN quota_usage jsonb NOT NULL DEFAULT '{"windows": {}}';
