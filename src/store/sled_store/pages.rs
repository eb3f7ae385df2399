//! The pages of paginated IDs in a state directory: the sled store's
//! [`Store::record_pages`](crate::store::Store::record_pages),
//! [`Store::page_marks`](crate::store::Store::page_marks) and
//! [`Store::pages`](crate::store::Store::pages), kept in the pages log
//! ([`pages_log`](super::pages_log)), which the first page written creates.
//!
//! The order that keeps a page from being lost while a record written after it is durable:
//! a sync makes the pages log durable before the results log (see
//! [`side_sync`](super::side_files::side_sync)), and a record that counts pages
//! ([`ItemRecord::pages`]) is appended to the results log only once the pages log is durable
//! ([`SledStore::pages_before_record`]): the results log may be made durable by more than a
//! sync (its own sync when many positions wait, the kernel writing its pages back), and a
//! record it holds after a crash is read as durable.

use super::pages_log::{AppendError, NewPage};
use super::{log_error, page_codec, SledStore};
use crate::store::{ItemRecord, PageMark, PageRecord, StoreError};

impl SledStore {
    /// [`Store::record_pages`](crate::store::Store::record_pages).
    pub(super) fn write_pages(&self, pages: &[(String, PageRecord)]) -> Result<(), StoreError> {
        if pages.is_empty() {
            return Ok(());
        }
        let log = self
            .pages
            .get_or_create(&self.path)
            .map_err(|e| log_error(&self.path, e))?;
        let mut encoded = Vec::with_capacity(pages.len() * 256);
        let mut ends = Vec::with_capacity(pages.len());
        for (_, page) in pages {
            page_codec::encode(page, &self.bodies, &mut encoded);
            ends.push(encoded.len());
        }
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let new: Vec<NewPage<'_>> = pages
            .iter()
            .zip(starts.zip(&ends))
            .map(|((id, page), (start, &end))| NewPage {
                row: page.row,
                id,
                generation: page.generation,
                page: page.mark.page,
                bytes: &encoded[start..end],
            })
            .collect();
        log.append(&new).map_err(|e| match e {
            AppendError::Log(e) => log_error(&self.path, e),
            AppendError::Refused(reason) => {
                StoreError::at(self.path.display(), StoreError::backend(reason))
            }
        })
    }

    /// [`Store::page_marks`](crate::store::Store::page_marks).
    pub(super) fn read_page_marks(
        &self,
        generation: u32,
        ids: &[(u64, &str)],
    ) -> Result<Vec<Option<PageMark>>, StoreError> {
        let Some(log) = self.pages.get() else {
            return Ok(vec![None; ids.len()]);
        };
        ids.iter()
            .map(|&(row, id)| {
                let last = log
                    .last(row, id, generation)
                    .map_err(|e| log_error(&self.path, e))?;
                last.map(|(page, bytes)| {
                    Ok(self.decode_page(row, id, generation, page, &bytes)?.mark)
                })
                .transpose()
            })
            .collect()
    }

    /// [`Store::pages`](crate::store::Store::pages).
    pub(super) fn read_pages(
        &self,
        row: u64,
        id: &str,
        generation: u32,
        from: u32,
        count: u32,
    ) -> Result<Vec<PageRecord>, StoreError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let Some(log) = self.pages.get() else {
            return Err(self.corrupt(format!(
                "page {from} of {id:?} (row {row}, generation {generation}) is missing: the \
                 store holds no pages"
            )));
        };
        let pages = log
            .pages(row, id, generation, from, count)
            .map_err(|e| log_error(&self.path, e))?;
        (from..)
            .zip(pages)
            .map(|(page, bytes)| self.decode_page(row, id, generation, page, &bytes))
            .collect()
    }

    /// Page `page` of `id` (at `row`) in `generation`, from its bytes in the pages log.
    fn decode_page(
        &self,
        row: u64,
        id: &str,
        generation: u32,
        page: u32,
        bytes: &[u8],
    ) -> Result<PageRecord, StoreError> {
        page_codec::decode(bytes, row, generation, page, &self.bodies).map_err(|e| {
            self.corrupt(format!(
                "{}: page {page} of {id:?} (row {row}, generation {generation}) is \
                 undecodable: {e}",
                super::pages_log::LOG_FILE
            ))
        })
    }

    /// Before `results` are appended to the results log: if one of them counts pages, make
    /// the pages log durable (see the module doc).
    pub(super) async fn pages_before_record(
        &self,
        results: &[(String, ItemRecord)],
    ) -> Result<(), StoreError> {
        if !results.iter().any(|(_, r)| r.pages.is_some()) {
            return Ok(());
        }
        let Some(log) = self.pages.get() else {
            return Ok(());
        };
        let _watch = crate::watchdog::watch("syncing the pages log");
        tokio::task::spawn_blocking(move || log.make_durable())
            .await
            .map_err(|e| {
                StoreError::at(
                    self.path.display(),
                    StoreError::backend(format!("syncing the pages log: {e}")),
                )
            })?
            .map_err(|e| log_error(&self.path, e))
    }
}
