//! `highwater export`: one record per unique ID (or, with `--per-item`, one row per item of
//! each ID), in input order, as JSON lines, CSV or Parquet, to standard output or a file.

use std::io;

use anyhow::{Context, Result};

use super::args::{CompressionArg, ExportArgs, StatusArg};
use super::exit;
use super::state::{open_reader, over_place, OverPlace, Tuning};
use crate::job::JobPlace;
use crate::say;
use crate::sink::{self, ExportFormat, InputColumns};
use crate::store::{ExportError, ItemStatus, Store};

pub(crate) async fn export(args: ExportArgs) -> Result<u8> {
    let parquet = args.format == ExportFormat::Parquet;
    if args.flatten && !parquet {
        say!("error: --flatten goes with --format parquet");
        return Ok(exit::USAGE);
    }
    if args.flatten && args.per_item {
        say!(
            "error: --flatten does not go with --per-item (a per-item export keeps each item \
             as JSON in its item column)"
        );
        return Ok(exit::USAGE);
    }
    if args.compression.is_some() && !parquet {
        say!("error: --compression goes with --format parquet");
        return Ok(exit::USAGE);
    }
    if parquet && args.output.is_none() {
        say!("error: --format parquet needs --output FILE (Parquet is not written to standard output)");
        return Ok(exit::USAGE);
    }
    let (state, job) = (args.state.clone(), args.job.clone());
    over_place(&state, job.as_deref(), Tuning::default(), Export(args)).await
}

/// `export` of the job at a place.
struct Export(ExportArgs);

impl OverPlace for Export {
    async fn over<P: JobPlace + Clone + 'static>(self, place: P) -> Result<u8> {
        let (store, _) = open_reader(&place).await?;
        export_of(&*store, &self.0).await
    }
}

/// `export` over an opened store.
async fn export_of<S: Store>(store: &S, args: &ExportArgs) -> Result<u8> {
    let parquet = args.format == ExportFormat::Parquet;
    let only = args.status.map(|s| match s {
        StatusArg::Ok => ItemStatus::Ok,
        StatusArg::Failed => ItemStatus::Failed,
    });
    let taken: &[&str] = match (args.per_item, parquet) {
        (true, _) => &sink::ITEM_COLUMNS,
        (false, true) => &sink::parquet::FIXED,
        (false, false) => &sink::COLUMNS,
    };
    let columns = match InputColumns::of(store, &args.columns, taken).await {
        Ok(columns) => columns,
        Err(ExportError::Columns(e)) => {
            say!("error: --columns: {e}");
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e).context("reading the job"),
    };
    let compression = match args.compression.unwrap_or(CompressionArg::Snappy) {
        CompressionArg::Snappy => sink::parquet::ParquetCompression::Snappy,
        CompressionArg::Zstd => sink::parquet::ParquetCompression::Zstd,
        CompressionArg::None => sink::parquet::ParquetCompression::None,
    };
    let per_item = args.per_item;
    match &args.output {
        Some(path) => {
            let n = match (per_item, parquet) {
                (true, true) => {
                    sink::parquet::export_items_to_file(store, only, compression, &columns, path)
                        .await
                }
                (true, false) => {
                    sink::export_items_to_file(store, args.format, only, &columns, path).await
                }
                (false, true) => {
                    let options = sink::parquet::ParquetOptions {
                        flatten: args.flatten,
                        compression,
                    };
                    sink::parquet::export_to_file(store, only, options, &columns, path).await
                }
                (false, false) => {
                    sink::export_to_file(store, args.format, only, &columns, path).await
                }
            }
            .with_context(|| format!("exporting to {}", path.display()))?;
            say!(
                "wrote {n} {} to {}{}",
                if per_item { "rows" } else { "records" },
                path.display(),
                crate::os::peak_memory_note()
            );
        }
        None => {
            let mut out = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
            let written = if per_item {
                sink::export_items(store, args.format, only, &columns, &mut out).await
            } else {
                sink::export(store, args.format, only, &columns, &mut out).await
            };
            match written {
                Ok(_) => {}
                Err(crate::store::ExportError::Write(e))
                    if e.kind() == io::ErrorKind::BrokenPipe => {}
                Err(e) => return Err(e).context("exporting to standard output"),
            }
        }
    }
    Ok(exit::OK)
}
