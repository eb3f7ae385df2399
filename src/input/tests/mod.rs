//! The input's tests through its front door, [`InputReader`](super::InputReader): single
//! files of the line formats (`reader`), Parquet files (`parquet`) and folders of files
//! read as one (`folder`).

mod folder;
mod parquet;
mod reader;
