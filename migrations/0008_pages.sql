-- highwater's PostgreSQL store, schema version 8: the pages of paginated IDs (see
-- src/store/pages.rs and src/store/postgres/pages.rs).

-- One page of an ID's answer: the items kept of it (json, byte for byte, in their order)
-- and where the ID's pages stand after it (mark: its number, its count, the request for the
-- next page, the ID's attempts and usage so far). A rerun asks for every page again in a
-- generation of its own (its number), so the job's pages are never mixed with its pages.
-- Written fenced by the bucket's lease like hw_item; a page written again replaces itself.
CREATE TABLE hw_page (
    job_id      bigint NOT NULL REFERENCES hw_job ON DELETE CASCADE,
    id          text NOT NULL,
    generation  integer NOT NULL,
    page        integer NOT NULL,
    bucket      bigint NOT NULL,
    "row"       bigint NOT NULL,
    mark        jsonb NOT NULL,
    items       json NOT NULL,
    lease_token bigint NOT NULL,
    PRIMARY KEY (job_id, id, generation, page)
);
