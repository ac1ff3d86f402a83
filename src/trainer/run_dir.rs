//! A minimal run-directory writer used until the `report` module lands.
// TODO(merge): replace with `report::RunDir` (same interface) and delete this file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::types::CheckpointRef;

/// One record of `checkpoints.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The next step to run.
    pub step: u64,
    /// Checkpoint name.
    pub name: String,
    /// The backend's checkpoint.
    pub backend: CheckpointRef,
    /// Loop state.
    pub loop_state: serde_json::Value,
}

/// A run directory.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|e| Error::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("renaming", path, e))
}

fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("reading", path, e)),
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| Error::data_line(path, i + 1, e.to_string()))
        })
        .collect()
}

fn append_line<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut line = serde_json::to_string(value)
        .map_err(|e| Error::Backend(format!("serializing a row: {e}")))?;
    line.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io("opening", path, e))?;
    f.write_all(line.as_bytes())
        .map_err(|e| Error::io("appending to", path, e))
}

impl RunDir {
    /// Creates the directory (ok if it exists).
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        std::fs::create_dir_all(&path).map_err(|e| Error::io("creating directory", &path, e))?;
        Ok(RunDir { path })
    }
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Writes `config.json`.
    pub fn write_config<T: Serialize>(&self, config: &T) -> Result<()> {
        let text = serde_json::to_string_pretty(config)
            .map_err(|e| Error::Backend(format!("serializing the config: {e}")))?;
        write_atomic(&self.path.join("config.json"), text.as_bytes())
    }
    /// Appends a row to `metrics.jsonl`.
    pub fn append_metrics(&mut self, row: &BTreeMap<String, serde_json::Value>) -> Result<()> {
        append_line(&self.path.join("metrics.jsonl"), row)
    }
    /// Reads `metrics.jsonl`.
    pub fn read_metrics(&self) -> Result<Vec<BTreeMap<String, serde_json::Value>>> {
        read_jsonl(&self.path.join("metrics.jsonl"))
    }
    /// Drops rows with `step >= step`.
    pub fn truncate_metrics_from(&mut self, step: u64) -> Result<()> {
        let rows = self.read_metrics()?;
        let mut out = String::new();
        for row in rows {
            let keep = row
                .get("step")
                .and_then(serde_json::Value::as_u64)
                .is_none_or(|s| s < step);
            if keep {
                out.push_str(&serde_json::to_string(&row).unwrap_or_default());
                out.push('\n');
            }
        }
        write_atomic(&self.path.join("metrics.jsonl"), out.as_bytes())
    }
    /// Appends to `checkpoints.jsonl`.
    pub fn append_checkpoint(&mut self, rec: &CheckpointRecord) -> Result<()> {
        append_line(&self.path.join("checkpoints.jsonl"), rec)
    }
    /// The last record of `checkpoints.jsonl`.
    pub fn last_checkpoint(&self) -> Result<Option<CheckpointRecord>> {
        Ok(read_jsonl(&self.path.join("checkpoints.jsonl"))?.pop())
    }
}
