//! Input columns in an export: the kept columns of each ID's input row, carried beside its
//! result so the user's table has them without a join.
//!
//! A job keeps the columns its templates name and those asked for at creation
//! ([`crate::spec::JobSpec::columns`]); the plan stores them with each ID
//! ([`ItemRecord::values`]). An export may carry any of them, each as a column (a field of a
//! JSON line, a CSV column, a Parquet String column) named as in the input: a string as its
//! text, any other value (a number, a JSON line's object) as its JSON text. A record without
//! stored values (planned before the job kept any) has none.

use crate::spec::JobSpec;
use crate::store::{ExportError, ItemRecord, Store, StoreError};

/// The input columns an export carries, checked against the job (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct InputColumns {
    names: Vec<String>,
}

impl InputColumns {
    /// None: the export carries no input column.
    pub fn none() -> InputColumns {
        InputColumns::default()
    }

    /// The columns `names` of the job `store` holds: each must be one the job keeps and not
    /// named like one of the export's own columns (`taken`).
    pub async fn of(
        store: &impl Store,
        names: &[String],
        taken: &[&str],
    ) -> Result<InputColumns, ExportError> {
        if names.is_empty() {
            return Ok(InputColumns::none());
        }
        let job = store
            .job()
            .await?
            .ok_or_else(|| StoreError::corrupt("the store holds no job"))?;
        let spec = JobSpec::from_stored(&job)?;
        for (i, name) in names.iter().enumerate() {
            if !spec.columns.contains(name) {
                let kept = if spec.columns.is_empty() {
                    "none".to_string()
                } else {
                    spec.columns.join(", ")
                };
                return Err(ExportError::Columns(format!(
                    "the job keeps no input column {name:?} (it keeps: {kept}); a job keeps the \
                     columns its templates name and those asked for when it is created"
                )));
            }
            if taken.contains(&name.as_str()) || names[..i].contains(name) {
                return Err(ExportError::Columns(format!(
                    "the input column {name:?} is named like a column the export already has"
                )));
            }
        }
        Ok(InputColumns {
            names: names.to_vec(),
        })
    }

    /// Whether no input column is asked for.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The input columns asked for, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// `record`'s values of the columns, by name, in their order; a record without stored
    /// values has none.
    pub fn values(&self, record: &ItemRecord) -> serde_json::Map<String, serde_json::Value> {
        let mut row: serde_json::Map<String, serde_json::Value> = record
            .values
            .as_deref()
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        let mut out = serde_json::Map::new();
        for name in &self.names {
            if let Some(value) = row.remove(name) {
                out.insert(name.clone(), value);
            }
        }
        out
    }

    /// `record`'s values of the columns, in their order, as text (see the module doc).
    pub fn texts(&self, record: &ItemRecord) -> Vec<Option<String>> {
        let mut row = self.values(record);
        self.names
            .iter()
            .map(|name| row.remove(name).map(text))
            .collect()
    }
}

/// A value as a column's text: a string as itself, anything else as JSON.
fn text(value: serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}
