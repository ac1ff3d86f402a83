//! The run directory: what a training run leaves on disk, and how it shows progress.
//!
//! A run directory mirrors the Python cookbook's log directory so its users feel at home
//! (see `docs/run-directory.md` for every file and its format):
//!
//! ```text
//! <run>/
//!   config.json                     the run's configuration, secrets redacted (written atomically)
//!   metrics.jsonl                   one JSON object per step: {"step": 0, "env/all/reward/total": 0.25, ...}
//!   checkpoints.jsonl               one CheckpointRecord per saved checkpoint
//!   samples/000000.jsonl            the step's samples, one SampleRecord per line
//!   samples/000000.html             the same samples, readable in a browser (self-contained)
//!   reward.png, reward.svg          train reward and test accuracy per step (feature `plot`)
//!   events.out.tfevents.*           the metrics for TensorBoard and W&B (`TrainerConfig::tensorboard`)
//!   metrics.jsonl.pre_resume_NNNNNN backup written when a resume dropped rows
//! ```
//!
//! Nothing is ever half-written: whole files (`config.json`, samples, plots, a rewritten
//! `metrics.jsonl`) go to a temporary file in the same directory that is then renamed over
//! the target, and `.jsonl` files grow by appending one whole line at a time, flushed to disk.
//! If a crash still leaves a torn last line (no trailing newline) in `metrics.jsonl` or
//! `checkpoints.jsonl`, [`RunDir::create`] repairs it (a torn line that is not valid JSON is
//! dropped with a warning; a complete record that only lacks its newline is kept), and
//! readers report any malformed line as [`Error::Data`] naming the file and the line.
//!
//! ```
//! use std::collections::BTreeMap;
//! use rlvr::report::RunDir;
//!
//! # fn main() -> rlvr::Result<()> {
//! let tmp = std::env::temp_dir().join(format!("rlvr-doc-rundir-{}", std::process::id()));
//! let mut run = RunDir::create(&tmp)?;
//! run.write_config(&serde_json::json!({"model": "tiny", "api_key": "sk-123"}))?;
//! let mut row = BTreeMap::new();
//! row.insert("step".to_string(), serde_json::json!(0));
//! row.insert("env/all/reward/total".to_string(), serde_json::json!(0.5));
//! run.append_metrics(&row)?;
//! assert_eq!(run.read_metrics()?.len(), 1);
//! let config = std::fs::read_to_string(run.path().join("config.json")).unwrap();
//! assert!(!config.contains("sk-123"));
//! # std::fs::remove_dir_all(&tmp).ok();
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::renderer::ParseTermination;
use crate::types::{CheckpointRef, StopReason};

mod naming;
#[cfg(feature = "plot")]
mod plot;
mod progress;
mod samples;
mod sink;
#[cfg(feature = "tensorboard")]
mod tensorboard;

pub use naming::run_name;
#[cfg(feature = "plot")]
pub use plot::{PLOT_HEIGHT, PLOT_WIDTH};
pub use progress::{PhaseBar, Progress, ProgressMode};
pub(crate) use samples::render_samples_html;
pub use sink::MetricsSink;
#[cfg(feature = "tensorboard")]
pub use tensorboard::{
    TENSORBOARD_CONFIG_TAG, TENSORBOARD_FILE_PREFIX, TensorBoardEvent, TensorBoardSink,
    read_tensorboard_events,
};

/// File name of the run's configuration.
pub const CONFIG_FILE: &str = "config.json";
/// File name of the per-step metrics.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// File name of the checkpoint records.
pub const CHECKPOINTS_FILE: &str = "checkpoints.jsonl";
/// Directory of the per-step samples.
pub const SAMPLES_DIR: &str = "samples";
/// Directory of the batches sampled ahead (`max_steps_off_policy > 0`) that checkpoints
/// saved: `prefetched/<checkpoint name>.json`.
pub const PREFETCHED_DIR: &str = "prefetched";
/// File name of the reward plot (PNG).
pub const PLOT_PNG: &str = "reward.png";
/// File name of the reward plot (SVG).
pub const PLOT_SVG: &str = "reward.svg";
/// The metrics key of the train reward that [`RunDir::plot`] draws.
pub const TRAIN_REWARD_KEY: &str = "env/all/reward/total";
/// The preferred metrics key of the test accuracy that [`RunDir::plot`] draws. When absent,
/// the first key (in sorted order) that starts with `test/` and ends with `correct` is used.
pub const TEST_ACCURACY_KEY: &str = "test/env/all/correct";
/// What [`redact_secrets`] puts in place of a secret value.
pub const REDACTED: &str = "[redacted]";

/// One sampled completion, as written to `samples/NNNNNN.jsonl` and `.html`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// The problem's id (from the dataset).
    pub problem_id: String,
    /// Index of the group (one group per problem per step).
    pub group: usize,
    /// The prompt as text (what the model saw, decoded).
    pub prompt: String,
    /// The completion as text (decoded, stop sequence included if it was sampled).
    pub completion: String,
    /// The total reward.
    pub reward: f64,
    /// The group-relative advantage the completion was trained with.
    pub advantage: f64,
    /// Named reward components (`correct`, `format`, ...).
    pub components: BTreeMap<String, f64>,
    /// Why the sampler stopped.
    pub stop_reason: StopReason,
    /// How the renderer's parser saw the end of the response.
    pub termination: ParseTermination,
    /// Number of sampled tokens.
    pub tokens: usize,
    /// The policy version (training step whose weights sampled it). Files written before
    /// this field existed read back as 0.
    #[serde(default)]
    pub policy_version: u64,
    /// How many updates old that policy was when the sample was trained on (the step minus
    /// `policy_version`; > 0 only off-policy).
    #[serde(default)]
    pub staleness: u64,
}

/// One line of `checkpoints.jsonl`: a saved state the trainer can resume from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The **next** step to run when resuming from this checkpoint (the cookbook's `batch`).
    pub step: u64,
    /// The checkpoint's name (`"000020"`, `"final"`, ...).
    pub name: String,
    /// Where the backend saved the weights and optimizer state.
    pub backend: CheckpointRef,
    /// Everything else the training loop needs to continue exactly (data cursor, RNG state,
    /// cumulative counters...). Opaque to this module.
    pub loop_state: serde_json::Value,
}

/// A run directory: see the [module documentation](self).
///
/// Several `RunDir` values on the same directory are not coordinated with each other; one
/// training run should own its directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
    /// Files written since the last checkpoint, not yet synced to disk (`metrics.jsonl`,
    /// sample files: see [`sync`](Self::sync)); shared by the clones.
    unsynced: std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>,
}

impl RunDir {
    /// Opens the run directory at `path`, creating it (and its parents) if needed.
    ///
    /// An existing directory is fine (that is how a run resumes). A torn last line in an
    /// existing `metrics.jsonl` or `checkpoints.jsonl` is repaired here (see the
    /// [module documentation](self)), and the hidden temporaries of writers that were killed
    /// mid-write (processes no longer running) are removed.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        fs::create_dir_all(&path).map_err(|e| Error::io("creating directory", &path, e))?;
        let run = RunDir {
            path,
            unsynced: std::sync::Arc::default(),
        };
        crate::fsio::sweep_stale_temps(&run.path);
        crate::fsio::sweep_stale_temps(&run.path.join(SAMPLES_DIR));
        crate::fsio::sweep_stale_temps(&run.path.join(PREFETCHED_DIR));
        repair_torn_last_line(&run.metrics_path())?;
        repair_torn_last_line(&run.checkpoints_path())?;
        Ok(run)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path of `metrics.jsonl`.
    pub fn metrics_path(&self) -> PathBuf {
        self.path.join(METRICS_FILE)
    }

    /// Path of `checkpoints.jsonl`.
    pub fn checkpoints_path(&self) -> PathBuf {
        self.path.join(CHECKPOINTS_FILE)
    }

    /// Path of `samples/NNNNNN.jsonl` for `step` (its `.html` sibling has the same stem).
    pub fn samples_path(&self, step: u64) -> PathBuf {
        self.path.join(SAMPLES_DIR).join(format!("{step:06}.jsonl"))
    }

    /// Writes `config.json` (pretty-printed, atomically), with secrets redacted by
    /// [`redact_secrets`].
    pub fn write_config<T: Serialize>(&self, config: &T) -> Result<()> {
        self.write_config_file(CONFIG_FILE, config)
    }

    /// Path of the config a resume from `step` records: `config.resume-NNNNNN.json`.
    pub fn resume_config_path(&self, step: u64) -> PathBuf {
        self.path.join(format!("config.resume-{step:06}.json"))
    }

    /// Writes the config of a run resumed at `step` to
    /// [`resume_config_path`](Self::resume_config_path), like
    /// [`write_config`](Self::write_config) (the original `config.json` is left as it is).
    pub fn write_resume_config<T: Serialize>(&self, step: u64, config: &T) -> Result<()> {
        self.write_config_file(&format!("config.resume-{step:06}.json"), config)
    }

    fn write_config_file<T: Serialize>(&self, name: &str, config: &T) -> Result<()> {
        let path = self.path.join(name);
        let mut value = serde_json::to_value(config)
            .map_err(|e| Error::config("config", format!("cannot serialize to JSON: {e}")))?;
        redact_secrets(&mut value);
        let mut text = serde_json::to_string_pretty(&value)
            .map_err(|e| Error::config("config", format!("cannot serialize to JSON: {e}")))?;
        text.push('\n');
        write_atomic(&path, text.as_bytes())
    }

    /// Appends one row to `metrics.jsonl` (one whole line, flushed to the operating system).
    ///
    /// Rows normally carry a `"step"` key; rows without one (summaries) are allowed and are
    /// kept by [`truncate_metrics_from`](Self::truncate_metrics_from). The file is synced to
    /// disk with the next [`append_checkpoint`](Self::append_checkpoint) (or
    /// [`sync`](Self::sync)), not on every row: a killed process loses nothing, and after a
    /// power failure the rows missing are those of steps past the last checkpoint — the steps
    /// a resume runs again, and whose rows it drops anyway.
    pub fn append_metrics(&mut self, row: &BTreeMap<String, serde_json::Value>) -> Result<()> {
        let path = self.metrics_path();
        append_jsonl(&path, row, false)?;
        let mut unsynced = self
            .unsynced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !unsynced.contains(&path) {
            unsynced.push(path);
        }
        Ok(())
    }

    /// Syncs to disk what this run directory wrote since the last checkpoint record
    /// (`metrics.jsonl` rows, sample files). [`append_checkpoint`](Self::append_checkpoint)
    /// does this itself; call it after rows written past the last checkpoint that must
    /// survive a power failure.
    pub fn sync(&self) -> Result<()> {
        let unsynced = std::mem::take(
            &mut *self
                .unsynced
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        crate::fsio::sync_files(&unsynced)
    }

    /// Reads every row of `metrics.jsonl` (none if it does not exist yet).
    ///
    /// A line that is not a JSON object is an [`Error::Data`] naming the file and the line.
    pub fn read_metrics(&self) -> Result<Vec<BTreeMap<String, serde_json::Value>>> {
        read_jsonl(&self.metrics_path())
    }

    /// Drops the rows whose `step` is `>= step` (what a resume from `step` does), by an atomic
    /// rewrite of `metrics.jsonl`. Kept lines are copied byte for byte; rows without a `step`
    /// are kept. When rows are dropped, the previous file is first copied to
    /// `metrics.jsonl.pre_resume_NNNNNN` (`NNNNNN` = `step`), as the cookbook does.
    pub fn truncate_metrics_from(&mut self, step: u64) -> Result<()> {
        let path = self.metrics_path();
        // Only a regular file holds rows to drop (a device such as `/dev/null` has none, and
        // reading `/dev/zero` would never end).
        if !fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false) {
            return Ok(());
        }
        let Some(bytes) = read_if_exists(&path)? else {
            return Ok(());
        };
        let mut kept = Vec::with_capacity(bytes.len());
        let mut dropped = 0usize;
        for (index, line) in split_lines(&bytes) {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let row: BTreeMap<String, serde_json::Value> = parse_line(&path, index, line)?;
            let keep = match row.get("step") {
                None => true,
                Some(v) => {
                    step_of(v).ok_or_else(|| {
                        Error::data_line(
                            &path,
                            index + 1,
                            format!("`step` is not a non-negative integer: {v}"),
                        )
                    })? < step
                }
            };
            if keep {
                kept.extend_from_slice(line);
                kept.push(b'\n');
            } else {
                dropped += 1;
            }
        }
        if dropped == 0 {
            return Ok(());
        }
        let backup = self
            .path
            .join(format!("{METRICS_FILE}.pre_resume_{step:06}"));
        write_atomic(&backup, &bytes)?;
        tracing::info!(
            file = %path.display(),
            dropped,
            from_step = step,
            backup = %backup.display(),
            "dropped metrics rows past the resume point"
        );
        write_atomic(&path, &kept)
    }

    /// Path of the batches sampled ahead that checkpoint `name` saved
    /// (`prefetched/<name>.json`).
    pub fn prefetched_path(&self, name: &str) -> PathBuf {
        self.path.join(PREFETCHED_DIR).join(format!("{name}.json"))
    }

    /// Removes the samples of every step `>= step` (`samples/NNNNNN.jsonl` and `.html`): what
    /// a resume from `step` does, so that the steps it runs again are not recorded twice.
    /// Returns how many steps' samples were removed.
    pub fn drop_samples_from(&mut self, step: u64) -> Result<usize> {
        let dir = self.path.join(SAMPLES_DIR);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::io("listing", &dir, e)),
        };
        let mut removed = std::collections::BTreeSet::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("listing", &dir, e))?;
            let path = entry.path();
            let ext_ok = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("jsonl" | "html")
            );
            let file_step = path
                .file_stem()
                .and_then(|s| s.to_str())
                .filter(|s| s.len() >= 6 && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok());
            if let (true, Some(n)) = (ext_ok, file_step)
                && n >= step
            {
                fs::remove_file(&path).map_err(|e| Error::io("removing", &path, e))?;
                removed.insert(n);
            }
        }
        if !removed.is_empty() {
            crate::fsio::sync_dir(&dir);
            tracing::info!(dir = %dir.display(), steps = removed.len(), from_step = step, "dropped samples past the resume point");
        }
        Ok(removed.len())
    }

    /// Appends one record to `checkpoints.jsonl` (one whole line, flushed and synced), after
    /// syncing the `metrics.jsonl` rows and sample files written since the previous
    /// checkpoint ([`sync`](Self::sync)).
    pub fn append_checkpoint(&mut self, rec: &CheckpointRecord) -> Result<()> {
        self.sync()?;
        append_jsonl(&self.checkpoints_path(), rec, true)
    }

    /// Every record of `checkpoints.jsonl`, oldest first (none if it does not exist yet).
    pub fn read_checkpoints(&self) -> Result<Vec<CheckpointRecord>> {
        read_jsonl(&self.checkpoints_path())
    }

    /// The last record of `checkpoints.jsonl`: the one a resume starts from.
    pub fn last_checkpoint(&self) -> Result<Option<CheckpointRecord>> {
        Ok(self.read_checkpoints()?.pop())
    }

    /// Writes `samples/NNNNNN.jsonl` (one [`SampleRecord`] per line) and `samples/NNNNNN.html`
    /// (a self-contained HTML page) for `step`, both atomically (a reader or a resumed run
    /// sees the old file or the new one, never a mix). They are synced to disk with the next
    /// [`append_checkpoint`](Self::append_checkpoint), not every step: after a power failure
    /// the samples of steps past the last checkpoint may be missing — those steps run again
    /// on resume, which rewrites them.
    pub fn write_samples(&self, step: u64, samples: &[SampleRecord]) -> Result<()> {
        let dir = self.path.join(SAMPLES_DIR);
        fs::create_dir_all(&dir).map_err(|e| Error::io("creating directory", &dir, e))?;
        let jsonl_path = self.samples_path(step);
        let jsonl = samples::write_json_lines(samples).map_err(|e| {
            Error::io(
                "serializing samples for",
                &jsonl_path,
                std::io::Error::other(e),
            )
        })?;
        let html_path = jsonl_path.with_extension("html");
        crate::fsio::write_atomic_unsynced(&jsonl_path, &jsonl)?;
        let html = render_samples_html(step, samples);
        crate::fsio::write_atomic_unsynced(&html_path, html.as_bytes())?;
        let mut unsynced = self
            .unsynced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        unsynced.push(jsonl_path);
        unsynced.push(html_path);
        Ok(())
    }

    /// Draws `reward.png` and `reward.svg` from `metrics.jsonl`: the train reward
    /// ([`TRAIN_REWARD_KEY`]) per step with its moving average, and the test accuracy
    /// ([`TEST_ACCURACY_KEY`], or any `test/...correct` key) when present. Both files are
    /// written atomically; with no data yet, the chart is drawn empty.
    ///
    /// Without the `plot` feature this does nothing and returns `Ok(())`.
    pub fn plot(&self) -> Result<()> {
        #[cfg(feature = "plot")]
        {
            let rows = self.read_metrics()?;
            plot::plot_metrics(&rows, &self.path.join(PLOT_PNG), &self.path.join(PLOT_SVG))
        }
        #[cfg(not(feature = "plot"))]
        {
            Ok(())
        }
    }
}

/// A short one-line summary of a metrics row for [`Progress::step_done`]: the train reward,
/// `correct` and `format` rates, the test accuracy and the step time when present, e.g.
/// `"reward 0.438 correct 0.375 test 0.300 12.3s"`.
///
/// ```
/// use std::collections::BTreeMap;
/// let mut row = BTreeMap::new();
/// row.insert("step".to_string(), serde_json::json!(4));
/// row.insert("env/all/reward/total".to_string(), serde_json::json!(0.4375));
/// row.insert("time/total".to_string(), serde_json::json!(12.34));
/// assert_eq!(rlvr::report::step_summary(&row), "reward 0.438 12.3s");
/// ```
pub fn step_summary(row: &BTreeMap<String, serde_json::Value>) -> String {
    let mut parts = Vec::new();
    for (key, label) in [
        (TRAIN_REWARD_KEY, "reward"),
        ("env/all/correct", "correct"),
        ("env/all/format", "format"),
        (TEST_ACCURACY_KEY, "test"),
    ] {
        if let Some(v) = row.get(key).and_then(serde_json::Value::as_f64) {
            parts.push(format!("{label} {v:.3}"));
        }
    }
    if let Some(t) = row.get("time/total").and_then(serde_json::Value::as_f64) {
        parts.push(format!("{t:.1}s"));
    }
    parts.join(" ")
}

/// Replaces, recursively, the value of every object key that names a secret with
/// [`REDACTED`] (`null` values are left alone: an unset secret reveals nothing).
///
/// A key names a secret when, split into lower-case words at `_`, `-`, `.`, spaces and
/// camelCase boundaries, it has a word `token`, `secret`, `password`, `passwd`, `credential(s)`,
/// `apikey` or `authorization`, or the words `api key` / `private key` / `access key` in a row.
/// So `api_key`, `TINKER_API_KEY`, `apiKey`, `hf_token`, `client_secret` and `db_password`
/// are redacted, while `max_tokens`, `tokenizer` and `tokens_per_step` are not.
///
/// ```
/// let mut v = serde_json::json!({
///     "backend": {"api_key": "sk-1", "base_url": "http://x"},
///     "max_tokens": 256,
///     "hooks": [{"hfToken": "hf_2"}],
/// });
/// rlvr::report::redact_secrets(&mut v);
/// assert_eq!(v["backend"]["api_key"], "[redacted]");
/// assert_eq!(v["backend"]["base_url"], "http://x");
/// assert_eq!(v["max_tokens"], 256);
/// assert_eq!(v["hooks"][0]["hfToken"], "[redacted]");
/// ```
pub fn redact_secrets(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if is_secret_key(key) {
                    if !v.is_null() {
                        *v = serde_json::Value::String(REDACTED.to_string());
                    }
                } else {
                    redact_secrets(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_secrets),
        _ => {}
    }
}

/// Whether an object key names a secret (see [`redact_secrets`]).
pub fn is_secret_key(key: &str) -> bool {
    let words = key_words(key);
    let single = |w: &str| {
        matches!(
            w,
            "token"
                | "secret"
                | "password"
                | "passwd"
                | "credential"
                | "credentials"
                | "apikey"
                | "authorization"
        )
    };
    words.iter().any(|w| single(w))
        || words.windows(2).any(|p| {
            matches!(
                (p[0].as_str(), p[1].as_str()),
                ("api" | "private" | "access", "key")
            )
        })
}

/// Splits a key into lower-case words at separators and camelCase boundaries.
fn key_words(key: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut prev_lower_or_digit = false;
    for c in key.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            prev_lower_or_digit = false;
            continue;
        }
        if c.is_uppercase() && prev_lower_or_digit && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        prev_lower_or_digit = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, synced, then
/// renamed over `path` (and the directory synced). Readers see the old content or the new
/// one, never a mix; a crash leaves at most a hidden temporary, which the next
/// [`RunDir::create`] removes.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::fsio::write_atomic(path, bytes)
}

/// Appends `value` as one JSON line, repairing a torn last line first; with `sync`, also
/// syncs the file's data to disk.
fn append_jsonl<T: Serialize + ?Sized>(path: &Path, value: &T, sync: bool) -> Result<()> {
    let mut line = serde_json::to_string(value)
        .map_err(|e| Error::io("serializing a row for", path, std::io::Error::other(e)))?;
    line.push('\n');
    repair_torn_last_line(path)?;
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io("opening for append", path, e))?;
    // With a write hook, two writes with a pause point between them: a crash test kills the
    // process there to prove that a torn line is repaired.
    crate::fsio::write_pausing(&mut file, line.as_bytes(), "append", path)
        .map_err(|e| Error::io("appending to", path, e))?;
    file.flush().map_err(|e| Error::io("flushing", path, e))?;
    if sync {
        file.sync_data()
            .map_err(|e| Error::io("syncing", path, e))?;
    }
    Ok(())
}

/// Reads every non-blank line of a JSONL file as a `T` (none if the file does not exist).
fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let Some(bytes) = read_if_exists(path)? else {
        return Ok(Vec::new());
    };
    let torn_at = if bytes.is_empty() || bytes.ends_with(b"\n") {
        None
    } else {
        Some(split_lines(&bytes).count().saturating_sub(1))
    };
    let mut out = Vec::new();
    for (index, line) in split_lines(&bytes) {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match parse_line(path, index, line) {
            Ok(v) => out.push(v),
            Err(Error::Data {
                file,
                location_kind,
                location,
                message,
            }) if torn_at == Some(index) => {
                return Err(Error::Data {
                    file,
                    location_kind,
                    location,
                    message: format!(
                        "torn last line (no trailing newline; a writer probably crashed): \
                         {message}; reopen the run directory with RunDir::create to repair it"
                    ),
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Parses one JSONL line (0-based `index`) into a `T`, or a [`Error::Data`] at line `index + 1`.
fn parse_line<T: DeserializeOwned>(path: &Path, index: usize, line: &[u8]) -> Result<T> {
    serde_json::from_slice(line)
        .map_err(|e| Error::data_line(path, index + 1, format!("invalid JSON record: {e}")))
}

/// The lines of `bytes` (without their `\n`), numbered from 0. A final empty segment after
/// the last newline is not a line.
fn split_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let empty = bytes.is_empty();
    body.split(|b| *b == b'\n')
        .filter(move |_| !empty)
        .enumerate()
}

/// `step` as a non-negative integer (integral floats are accepted).
fn step_of(v: &serde_json::Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    })
}

fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("reading", path, e)),
    }
}

/// If `path` exists and does not end with a newline, its last line was torn by a crash:
/// complete it with a newline when it is a valid JSON value, otherwise drop it (atomic
/// rewrite) with a warning naming the file and the line.
fn repair_torn_last_line(path: &Path) -> Result<()> {
    // Cheap check first: look at the last byte only.
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("opening", path, e)),
    };
    let len = file
        .metadata()
        .map_err(|e| Error::io("reading metadata of", path, e))?
        .len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::End(-1))
        .and_then(|_| file.read_exact(&mut last))
        .map_err(|e| Error::io("reading", path, e))?;
    if last[0] == b'\n' {
        return Ok(());
    }
    drop(file);
    let bytes = fs::read(path).map_err(|e| Error::io("reading", path, e))?;
    let cut = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let tail = bytes.get(cut..).unwrap_or_default();
    let line_no = bytes
        .get(..cut)
        .unwrap_or_default()
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1;
    let mut repaired = bytes.get(..cut).unwrap_or_default().to_vec();
    if tail.iter().all(u8::is_ascii_whitespace) {
        tracing::warn!(file = %path.display(), line = line_no, "removed trailing whitespace after the last record");
    } else if serde_json::from_slice::<serde_json::Value>(tail).is_ok() {
        repaired.extend_from_slice(tail);
        repaired.push(b'\n');
        tracing::warn!(file = %path.display(), line = line_no, "completed a last record that lacked its newline");
    } else {
        tracing::warn!(
            file = %path.display(),
            line = line_no,
            bytes = tail.len(),
            "dropped a torn last line (a writer probably crashed mid-line)"
        );
    }
    write_atomic(path, &repaired)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_words_split() {
        assert_eq!(key_words("TINKER_API_KEY"), ["tinker", "api", "key"]);
        assert_eq!(key_words("apiKey"), ["api", "key"]);
        assert_eq!(key_words("hf-token.value"), ["hf", "token", "value"]);
        assert_eq!(key_words("HTTPProxy"), ["httpproxy"]);
    }

    #[test]
    fn secret_keys() {
        for k in [
            "api_key",
            "apiKey",
            "TINKER_API_KEY",
            "token",
            "hf_token",
            "accessToken",
            "client_secret",
            "password",
            "db_passwd",
            "aws_access_key_id",
            "credentials",
            "Authorization",
            "apikey",
            "private_key",
        ] {
            assert!(is_secret_key(k), "{k} should be secret");
        }
        for k in [
            "max_tokens",
            "tokenizer",
            "tokens_per_step",
            "base_url",
            "keyboard",
            "key",
            "monkey",
            "model",
        ] {
            assert!(!is_secret_key(k), "{k} should not be secret");
        }
    }

    #[test]
    fn split_lines_numbering() {
        let v: Vec<_> = split_lines(b"a\nb\n").collect();
        assert_eq!(v, vec![(0, &b"a"[..]), (1, &b"b"[..])]);
        let v: Vec<_> = split_lines(b"a\nb").collect();
        assert_eq!(v, vec![(0, &b"a"[..]), (1, &b"b"[..])]);
        assert_eq!(split_lines(b"").count(), 0);
        assert_eq!(split_lines(b"\n").count(), 1);
    }

    #[test]
    fn step_values() {
        assert_eq!(step_of(&serde_json::json!(3)), Some(3));
        assert_eq!(step_of(&serde_json::json!(3.0)), Some(3));
        assert_eq!(step_of(&serde_json::json!(3.5)), None);
        assert_eq!(step_of(&serde_json::json!(-1)), None);
        assert_eq!(step_of(&serde_json::json!("3")), None);
    }
}
