//! Integration tests: the real `highwater` binary against an in-process API on 127.0.0.1.
//!
//! One test binary; each module tells one part of the users' story. [`harness`] starts the
//! fake API with chosen faults, runs the binary, kills and resumes it, and reads the export;
//! [`scenario`] tells such a story in one chain, and `fleet` (with the `postgres` feature)
//! the story of a job many workers share in a database of a throwaway cluster (`pg_cluster`).
//! `lazyfs` is a FUSE file system that models a power cut (what nobody synced is lost);
//! `lazyfs_model` tests the model itself.

#[cfg(feature = "postgres")]
mod fleet;
mod harness;
#[path = "../support/lazyfs.rs"]
mod lazyfs;
#[cfg(feature = "postgres")]
#[path = "../support/pg_cluster.rs"]
mod pg_cluster;
mod scenario;

mod answers;
mod bad_input;
mod batches;
mod crash;
mod credentials;
mod credit;
mod custom_store;
mod damaged_state;
mod dashboard;
mod durability;
mod examples;
mod exec;
mod folders;
mod inputs;
mod jobs;
mod lazyfs_model;
mod limit_req;
mod money;
mod old_formats;
mod pages;
mod pages_export;
mod pages_face;
mod parquet;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod postgres_faults;
#[cfg(feature = "postgres")]
mod postgres_fleet;
#[cfg(feature = "postgres")]
mod postgres_rerun;
mod power_cut;
mod power_cut_pages;
mod progress;
mod quotas;
mod refused_ids;
mod reruns;
mod rows;
mod stalled_store;
mod stop_and_resume;
mod throttle;
mod tokens;
mod usage;
