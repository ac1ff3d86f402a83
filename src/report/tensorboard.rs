//! TensorBoard event files (feature `tensorboard`): [`TensorBoardSink`] writes them,
//! [`read_tensorboard_events`] reads them back.
//!
//! An event file is a TFRecord file (each record: its length as a little-endian `u64`, the
//! masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data) of `Event`
//! protocol buffers (TensorFlow's `event.proto` and `summary.proto`; the few messages and
//! fields used here are declared below with `prost` derives).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use super::MetricsSink;
use crate::error::{Error, Result};

/// The prefix of every event file's name (what TensorBoard looks for is `tfevents`).
pub const TENSORBOARD_FILE_PREFIX: &str = "events.out.tfevents.";

/// The tag of the run configuration's text summary.
pub const TENSORBOARD_CONFIG_TAG: &str = "config";

/// The `file_version` of the first event of every file.
const FILE_VERSION: &str = "brain.Event:2";
/// `DataType.DT_STRING` of `types.proto`.
const DT_STRING: i32 = 7;
/// TFRecord's checksum: CRC-32C (Castagnoli), masked.
const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
/// Files created by this process, for unique names.
static FILES_CREATED: AtomicU64 = AtomicU64::new(0);

// ---------------------------------------------------------------------------------------------
// The protocol buffers (tensorflow/core/util/event.proto, framework/summary.proto,
// framework/tensor.proto, framework/tensor_shape.proto): the fields used here only.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "EventWhat", tags = "3, 5")]
    what: Option<EventWhat>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum EventWhat {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
    #[prost(oneof = "ValueKind", tags = "2, 8")]
    value: Option<ValueKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum ValueKind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

#[derive(Clone, PartialEq, prost::Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TensorProto {
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShapeProto>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TensorShapeProto {
    #[prost(message, repeated, tag = "2")]
    dim: Vec<TensorShapeDim>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TensorShapeDim {
    #[prost(int64, tag = "1")]
    size: i64,
}

// ---------------------------------------------------------------------------------------------
// TFRecord framing
// ---------------------------------------------------------------------------------------------

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = CRC32C.checksum(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its checksum, data, its checksum.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// Why the records of a file end early.
enum Unframed<'a> {
    /// Every record whole.
    Whole(Vec<&'a [u8]>),
    /// The records before a last one that is cut short (a writer that crashed mid-record).
    Truncated(Vec<&'a [u8]>),
}

/// The records of a TFRecord file; a checksum mismatch is an [`Error::Data`] naming the
/// 1-based record.
fn unframe<'a>(path: &Path, bytes: &'a [u8]) -> Result<Unframed<'a>> {
    let mut records = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let index = records.len() + 1;
        let bad = |message: String| Error::Data {
            file: path.to_path_buf(),
            location_kind: "record",
            location: index,
            message,
        };
        let (Some(len_bytes), Some(len_crc)) = (rest.get(..8), rest.get(8..12)) else {
            return Ok(Unframed::Truncated(records));
        };
        if le_u32(len_crc) != masked_crc(len_bytes) {
            return Err(bad(
                "the checksum of the record's length does not match".into()
            ));
        }
        let len = usize::try_from(u64::from_le_bytes(len_bytes.try_into().unwrap_or_default()))
            .map_err(|_| bad("record length out of range".into()))?;
        let end = len
            .checked_add(16)
            .ok_or_else(|| bad("record length out of range".into()))?;
        let (Some(data), Some(data_crc)) = (rest.get(12..12 + len), rest.get(12 + len..end)) else {
            return Ok(Unframed::Truncated(records));
        };
        if le_u32(data_crc) != masked_crc(data) {
            return Err(bad(
                "the checksum of the record's data does not match".into()
            ));
        }
        records.push(data);
        rest = rest.get(end..).unwrap_or_default();
    }
    Ok(Unframed::Whole(records))
}

fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().unwrap_or_default())
}

fn decode_event(path: &Path, index: usize, data: &[u8]) -> Result<Event> {
    Event::decode(data).map_err(|e| Error::Data {
        file: path.to_path_buf(),
        location_kind: "record",
        location: index + 1,
        message: format!("not an Event protocol buffer: {e}"),
    })
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn step_i64(step: u64) -> i64 {
    i64::try_from(step).unwrap_or(i64::MAX)
}

/// The host name, as it goes in an event file's name (TensorFlow's convention), with any
/// character other than letters, digits, `-` and `_` replaced by `_`.
fn hostname() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

// ---------------------------------------------------------------------------------------------
// The sink
// ---------------------------------------------------------------------------------------------

/// Writes the trainer's metrics as a TensorBoard event file, which TensorBoard
/// (`tensorboard --logdir <run>`) and Weights & Biases (`wandb sync --sync-tensorboard <run>`)
/// read. [`TrainerConfig::tensorboard`](crate::TrainerConfig::tensorboard) puts
/// one in the run directory; any directory will do for one made by hand.
///
/// The file, `events.out.tfevents.<seconds>.<host>.<pid>.<n>` in the directory (one per
/// sink, so one per process; TensorBoard reads every event file of a directory as one run,
/// and `tensorboard --logdir runs/` shows each run directory under `runs/` as a run), holds:
///
/// - a first event with `file_version = "brain.Event:2"`;
/// - at [`start`](MetricsSink::start), the run configuration as a text summary (tag
///   [`TENSORBOARD_CONFIG_TAG`], the text plugin's format, what `SummaryWriter.add_text`
///   writes: pretty-printed JSON indented as a Markdown code block), at the first step;
/// - per [`log_metrics`](MetricsSink::log_metrics), one event at that step with one scalar
///   (`simple_value`, an `f32`) per metric, tagged with the metric's name
///   (`env/all/reward/total`, ...).
///
/// Each event is written and flushed to the operating system when it is logged (a killed
/// process loses nothing); [`flush`](MetricsSink::flush) also syncs the file to disk — the
/// trainer calls it before recording each checkpoint, as `metrics.jsonl` is synced then.
///
/// On a resume, [`start`](MetricsSink::start) removes from the directory's *other* event
/// files the events at or past the first step (rewriting each atomically; a file left with
/// no metrics is deleted), as the trainer drops those rows from `metrics.jsonl`: the steps
/// run again appear once, with the resumed run's values, in every reader (otherwise a reader
/// would show the crashed run's values of those steps beside the resumed run's). An event
/// file that cannot be read is left as it is, with a warning.
///
/// ```
/// use std::collections::BTreeMap;
/// use rlvr::report::{read_tensorboard_events, MetricsSink, TensorBoardSink};
///
/// # fn main() -> rlvr::Result<()> {
/// let dir = std::env::temp_dir().join(format!("rlvr-doc-tb-{}", std::process::id()));
/// let mut sink = TensorBoardSink::create(&dir)?;
/// sink.start(&serde_json::json!({"batch_size": 16}), 0)?;
/// sink.log_metrics(0, &BTreeMap::from([("env/all/reward/total".to_string(), 0.25)]))?;
/// sink.flush()?;
/// let events = read_tensorboard_events(sink.path())?;
/// assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
/// assert!(events[1].texts[0].1.contains("\"batch_size\": 16"));
/// assert_eq!((events[2].step, events[2].scalars[0].1), (0, 0.25f32));
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
pub struct TensorBoardSink {
    path: PathBuf,
    file: BufWriter<File>,
}

impl std::fmt::Debug for TensorBoardSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorBoardSink")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TensorBoardSink {
    /// Creates a new event file in `dir` (created if needed, with its parents) and writes
    /// its first event (`file_version`).
    pub fn create(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir).map_err(|e| Error::io("creating directory", dir, e))?;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let n = FILES_CREATED.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(
            "{TENSORBOARD_FILE_PREFIX}{secs:010}.{}.{}.{n}",
            hostname(),
            std::process::id()
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io("creating", &path, e))?;
        let mut sink = TensorBoardSink {
            path,
            file: BufWriter::new(file),
        };
        sink.write_event(&Event {
            wall_time: now(),
            step: 0,
            what: Some(EventWhat::FileVersion(FILE_VERSION.into())),
        })?;
        Ok(sink)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event (one whole record, flushed to the operating system).
    fn write_event(&mut self, event: &Event) -> Result<()> {
        let record = frame(&event.encode_to_vec());
        self.file
            .write_all(&record)
            .and_then(|()| self.file.flush())
            .map_err(|e| Error::io("writing", &self.path, e))
    }

    /// Drops the events at or past `step` from the other event files of the directory.
    fn drop_events_from(&self, step: u64) -> Result<()> {
        let Some(dir) = self.path.parent() else {
            return Ok(());
        };
        let entries = fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                *p != self.path
                    && p.is_file()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(TENSORBOARD_FILE_PREFIX))
            })
            .collect();
        files.sort();
        for file in files {
            if let Err(e) = drop_file_events_from(&file, step_i64(step)) {
                tracing::warn!(file = %file.display(), error = %e, "left an unreadable TensorBoard event file as it is");
            }
        }
        Ok(())
    }
}

/// Rewrites `path` without its events at or past `step` (deleting it when only its
/// `file_version` would be left); a cut-short last record is dropped.
fn drop_file_events_from(path: &Path, step: i64) -> Result<()> {
    let bytes = fs::read(path).map_err(|e| Error::io("reading", path, e))?;
    let (records, truncated) = match unframe(path, &bytes)? {
        Unframed::Whole(r) => (r, false),
        Unframed::Truncated(r) => (r, true),
    };
    let mut kept = Vec::new();
    let mut kept_data = 0usize;
    let mut dropped = 0usize;
    for (index, data) in records.iter().enumerate() {
        let event = decode_event(path, index, data)?;
        let is_version = matches!(event.what, Some(EventWhat::FileVersion(_)));
        if is_version || event.step < step {
            kept.extend_from_slice(&frame(data));
            kept_data += usize::from(!is_version);
        } else {
            dropped += 1;
        }
    }
    if dropped == 0 && !truncated {
        return Ok(());
    }
    if kept_data == 0 {
        fs::remove_file(path).map_err(|e| Error::io("removing", path, e))?;
    } else {
        crate::fsio::write_atomic(path, &kept)?;
    }
    tracing::info!(file = %path.display(), dropped, from_step = step, "dropped TensorBoard events past the resume point");
    Ok(())
}

impl MetricsSink for TensorBoardSink {
    fn start(&mut self, config: &serde_json::Value, first_step: u64) -> Result<()> {
        self.drop_events_from(first_step)?;
        let json = serde_json::to_string_pretty(config)
            .map_err(|e| Error::config("config", format!("cannot serialize to JSON: {e}")))?;
        // A Markdown code block: the text plugin renders Markdown.
        let text: String = json.lines().map(|l| format!("    {l}\n")).collect();
        let value = SummaryValue {
            tag: TENSORBOARD_CONFIG_TAG.into(),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".into(),
                    // TextPluginData { version: 0 }, serialized: no bytes.
                    content: Vec::new(),
                }),
            }),
            value: Some(ValueKind::Tensor(TensorProto {
                dtype: DT_STRING,
                tensor_shape: Some(TensorShapeProto {
                    dim: vec![TensorShapeDim { size: 1 }],
                }),
                string_val: vec![text.into_bytes()],
            })),
        };
        self.write_event(&Event {
            wall_time: now(),
            step: step_i64(first_step),
            what: Some(EventWhat::Summary(Summary { value: vec![value] })),
        })
    }

    fn log_metrics(&mut self, step: u64, metrics: &BTreeMap<String, f64>) -> Result<()> {
        let value = metrics
            .iter()
            .map(|(tag, v)| SummaryValue {
                tag: tag.clone(),
                metadata: None,
                value: Some(ValueKind::SimpleValue(*v as f32)),
            })
            .collect();
        self.write_event(&Event {
            wall_time: now(),
            step: step_i64(step),
            what: Some(EventWhat::Summary(Summary { value })),
        })
    }

    fn flush(&mut self) -> Result<()> {
        self.file
            .flush()
            .and_then(|()| self.file.get_ref().sync_data())
            .map_err(|e| Error::io("syncing", &self.path, e))
    }
}

// ---------------------------------------------------------------------------------------------
// The reader
// ---------------------------------------------------------------------------------------------

/// One event of an event file, as [`read_tensorboard_events`] decodes it: the parts that
/// [`TensorBoardSink`] writes.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TensorBoardEvent {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// The step.
    pub step: i64,
    /// The `file_version` (the first event of a file: `"brain.Event:2"`).
    pub file_version: Option<String>,
    /// The scalar summaries (`simple_value`): tag and value, in file order.
    pub scalars: Vec<(String, f32)>,
    /// The text summaries (a string tensor of the `text` plugin): tag and text.
    pub texts: Vec<(String, String)>,
}

/// Reads every event of a TensorBoard event file, checking both checksums of every record.
///
/// A checksum mismatch, a record that is not an `Event`, or a last record cut short (a
/// writer that crashed mid-record) is an [`Error::Data`] naming the file and the 1-based
/// record (`location_kind = "record"`). Summary values other than scalars and text (images,
/// histograms, tensors of other plugins) are skipped.
pub fn read_tensorboard_events(path: impl AsRef<Path>) -> Result<Vec<TensorBoardEvent>> {
    let path = path.as_ref();
    let bytes = fs::read(path).map_err(|e| Error::io("reading", path, e))?;
    let records = match unframe(path, &bytes)? {
        Unframed::Whole(r) => r,
        Unframed::Truncated(r) => {
            return Err(Error::Data {
                file: path.to_path_buf(),
                location_kind: "record",
                location: r.len() + 1,
                message: "the last record is cut short (a writer probably crashed)".into(),
            });
        }
    };
    let mut out = Vec::with_capacity(records.len());
    for (index, data) in records.iter().enumerate() {
        let event = decode_event(path, index, data)?;
        let mut decoded = TensorBoardEvent {
            wall_time: event.wall_time,
            step: event.step,
            file_version: None,
            scalars: Vec::new(),
            texts: Vec::new(),
        };
        match event.what {
            Some(EventWhat::FileVersion(v)) => decoded.file_version = Some(v),
            Some(EventWhat::Summary(summary)) => {
                for value in summary.value {
                    match value.value {
                        Some(ValueKind::SimpleValue(v)) => decoded.scalars.push((value.tag, v)),
                        Some(ValueKind::Tensor(t))
                            if t.dtype == DT_STRING
                                && value
                                    .metadata
                                    .as_ref()
                                    .and_then(|m| m.plugin_data.as_ref())
                                    .is_some_and(|p| p.plugin_name == "text") =>
                        {
                            let text = t
                                .string_val
                                .iter()
                                .map(|s| String::from_utf8_lossy(s))
                                .collect::<Vec<_>>()
                                .join("\n");
                            decoded.texts.push((value.tag, text));
                        }
                        _ => {}
                    }
                }
            }
            None => {}
        }
        out.push(decoded);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::manual_rotate)] // TensorFlow's formula, as written in its source
    fn masked_crc_matches_tensorflow() {
        // CRC-32C of "123456789" is 0xe3069283 (the catalogue's check value).
        assert_eq!(CRC32C.checksum(b"123456789"), 0xe306_9283);
        // TensorFlow's mask: rotate right by 15, add 0xa282ead8.
        let crc = 0xe306_9283u32;
        assert_eq!(
            masked_crc(b"123456789"),
            ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn a_known_record() {
        // An empty Event (no fields): length 0.
        let r = frame(&[]);
        assert_eq!(r.len(), 16);
        assert_eq!(&r[..8], &[0; 8]);
        assert_eq!(le_u32(&r[8..12]), masked_crc(&[0; 8]));
        assert_eq!(le_u32(&r[12..16]), masked_crc(&[]));
    }

    #[test]
    fn events_round_trip_and_damage_is_found() {
        let dir = tempfile_dir("round-trip");
        let mut sink = TensorBoardSink::create(&dir).unwrap();
        sink.start(&serde_json::json!({"lr": 1e-5}), 3).unwrap();
        let row = BTreeMap::from([("a".to_string(), 0.1), ("b/c".to_string(), -2.5)]);
        sink.log_metrics(3, &row).unwrap();
        sink.flush().unwrap();
        let events = read_tensorboard_events(sink.path()).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[1].step, 3);
        assert_eq!(events[1].texts[0].0, "config");
        assert_eq!(
            events[2].scalars,
            vec![("a".to_string(), 0.1f32), ("b/c".to_string(), -2.5f32)]
        );

        let bytes = fs::read(sink.path()).unwrap();
        let damaged = dir.join("damaged");
        // A flipped data byte of the last record.
        let mut flipped = bytes.clone();
        let at = flipped.len() - 6;
        flipped[at] ^= 1;
        fs::write(&damaged, &flipped).unwrap();
        let err = read_tensorboard_events(&damaged).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Data {
                    location: 3,
                    location_kind: "record",
                    ..
                }
            ),
            "{err}"
        );
        // A cut-short last record.
        fs::write(&damaged, &bytes[..bytes.len() - 3]).unwrap();
        let err = read_tensorboard_events(&damaged).unwrap_err();
        assert!(err.to_string().contains("cut short"), "{err}");
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_restart_drops_the_later_events_of_earlier_files() {
        let dir = tempfile_dir("restart");
        let row = BTreeMap::from([("r".to_string(), 1.0)]);
        // A crashed process: steps 0..3 logged, the last record cut short.
        let mut crashed = TensorBoardSink::create(&dir).unwrap();
        crashed.start(&serde_json::json!({}), 0).unwrap();
        for step in 0..3 {
            crashed.log_metrics(step, &row).unwrap();
        }
        crashed.flush().unwrap();
        let crashed_path = crashed.path().to_path_buf();
        drop(crashed);
        let bytes = fs::read(&crashed_path).unwrap();
        fs::write(&crashed_path, &bytes[..bytes.len() - 3]).unwrap();
        // An earlier process with only step 2 and later: deleted.
        let mut late = TensorBoardSink::create(&dir).unwrap();
        late.log_metrics(2, &row).unwrap();
        let late_path = late.path().to_path_buf();
        drop(late);
        // A file that is not an event file at all is left alone.
        let other = dir.join(format!("{TENSORBOARD_FILE_PREFIX}garbage"));
        fs::write(&other, b"not a record, long enough").unwrap();

        let mut resumed = TensorBoardSink::create(&dir).unwrap();
        resumed.start(&serde_json::json!({}), 1).unwrap();
        let steps: Vec<(i64, usize)> = read_tensorboard_events(&crashed_path)
            .unwrap()
            .iter()
            .map(|e| (e.step, e.scalars.len() + e.texts.len()))
            .collect();
        assert_eq!(steps, [(0, 0), (0, 1), (0, 1)], "version, config, step 0");
        assert!(!late_path.exists());
        assert_eq!(fs::read(&other).unwrap(), b"not a record, long enough");
        fs::remove_dir_all(&dir).ok();
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "rlvr-tb-unit-{name}-{}-{}",
            std::process::id(),
            FILES_CREATED.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}
