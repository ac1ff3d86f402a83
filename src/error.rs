//! The crate-wide error type.
//!
//! One [`enum@Error`] with structured variants: every variant names what failed (a file and a
//! line, an endpoint and a status, a field) so a user can act on it without reading source.
//! Reward functions have their own, smaller [`RewardError`](crate::reward::RewardError): a
//! failing grade is counted by the trainer, never fatal — except a reward that keeps hanging,
//! which becomes [`Error::RewardHung`].

use std::path::PathBuf;

/// `Result` with the crate's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `rlvr`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation on a path failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`"reading"`, `"writing"`, `"creating directory"`...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Input data is malformed: a bad JSON line, a row without a required field, a missing
    /// column. `location` is 1-based (a line for text files, a row for columnar files).
    #[error("{}: {location_kind} {location}: {message}", file.display())]
    Data {
        /// The file that holds the bad input.
        file: PathBuf,
        /// `"line"`, `"row"` or `"record"` (of a TensorBoard event file).
        location_kind: &'static str,
        /// 1-based line, row or record number (0 when the problem is the whole file).
        location: usize,
        /// What is wrong.
        message: String,
    },

    /// A configuration value is invalid.
    #[error("invalid configuration: `{field}`: {message}")]
    Config {
        /// The field (or flag / environment variable) at fault.
        field: String,
        /// Why it is invalid.
        message: String,
    },

    /// Tokenizer loading, encoding or decoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// A renderer could not render or parse a conversation.
    #[error("renderer: {0}")]
    Renderer(String),

    /// An HTTP request got a non-success status that was not retried (or retries ran out).
    #[error("HTTP {status} from {method} {endpoint}: {body}")]
    Http {
        /// HTTP method.
        method: String,
        /// Path or URL of the request.
        endpoint: String,
        /// Status code.
        status: u16,
        /// The response body, kept raw (truncated to a few KiB).
        body: String,
    },

    /// The connection failed (DNS, TCP, TLS, timeout) after all retries.
    #[error("transport error on {endpoint}: {message}")]
    Transport {
        /// Path or URL of the request.
        endpoint: String,
        /// What the HTTP client reported.
        message: String,
    },

    /// A response could not be decoded. The raw body is kept for diagnosis.
    #[error("could not decode {what}: {message}")]
    Decode {
        /// What was being decoded (`"ForwardBackwardOutput protobuf"`, `"create_model response"`...).
        what: String,
        /// The decoder's message.
        message: String,
        /// The raw body that failed to decode.
        raw: Vec<u8>,
    },

    /// A remote request (a Tinker future) completed with an error.
    #[error("{request} failed ({category}): {message}")]
    RequestFailed {
        /// The request that failed, e.g. `"forward_backward (seq 3)"`.
        request: String,
        /// The server's error category (`"user"`, `"server"`, `"unknown"`).
        category: String,
        /// The server's message.
        message: String,
    },

    /// A backend operation failed (tensor shapes, model loading, numerical errors).
    #[error("backend: {0}")]
    Backend(String),

    /// A [`CustomLoss`](crate::loss::CustomLoss) returned an output that does not fit its
    /// data: gradients of the wrong number or length, or a non-finite value.
    #[error("custom loss{}: {message}", datum.map(|i| format!(", datum {i}")).unwrap_or_default())]
    CustomLoss {
        /// The datum at fault (`None` when the loss value itself is at fault).
        datum: Option<usize>,
        /// What is wrong.
        message: String,
    },

    /// The operation is not supported by this backend or configuration.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A download from the Hugging Face hub (or a compatible endpoint) failed.
    #[error("download of {repo}/{file} failed: {message}")]
    Hub {
        /// Repository id, e.g. `openai/gsm8k`.
        repo: String,
        /// File within the repository.
        file: String,
        /// What went wrong.
        message: String,
    },

    /// A checkpoint or run directory is unusable.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint path or name.
        path: String,
        /// What is wrong with it.
        message: String,
    },

    /// A model, adapter or export directory is unusable (missing or malformed files, weights
    /// that do not fit the model), or an export's output path already exists.
    #[error("{}: {message}", path.display())]
    Weights {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// Downloading a checkpoint's weights from Tinker failed
    /// ([`download_weights`](crate::backend::tinker::download_weights) and the checkpoint
    /// calls of the Tinker REST client). Nothing half-written is left in the output
    /// directory.
    #[error("downloading {tinker_path}{}: {message}", file.as_ref().map(|f| format!(" (file {f:?})")).unwrap_or_default())]
    WeightsDownload {
        /// The `tinker://` checkpoint path being downloaded.
        tinker_path: String,
        /// What kind of failure it is.
        kind: WeightsDownloadErrorKind,
        /// The file of the checkpoint at fault, when one is (its name in the checkpoint).
        file: Option<String>,
        /// What went wrong, with the local path where one is involved.
        message: String,
    },

    /// An operation was cancelled or its backend shut down.
    #[error("cancelled: {0}")]
    Cancelled(String),

    /// The reward function hung: `consecutive` grades in a row got no result within their
    /// timeout, reaching the hang limit of the [`GraderPool`](crate::reward::GraderPool)
    /// (the trainer's `max_consecutive_reward_hangs`). Fatal: the run stops instead of
    /// scoring every later completion 0 while hung threads hold the pool.
    #[error(
        "the reward hung: {consecutive} grades in a row got no result within the {timeout:?} \
         timeout (the last on problem `{problem}`; {hung_threads} of the {threads} grading \
         threads are stuck in the reward). Fix the reward (a deadlock, an unreachable judge \
         server?), raise `reward_timeout_s` if it is only slow, or raise \
         `max_consecutive_reward_hangs` (0 never stops)"
    )]
    RewardHung {
        /// The problem whose grade reached the limit.
        problem: String,
        /// Timeouts in a row (the limit).
        consecutive: usize,
        /// The reward timeout.
        timeout: std::time::Duration,
        /// Grading threads still running a reward that timed out.
        hung_threads: usize,
        /// The pool's bound on grading threads.
        threads: usize,
    },
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// An [`Error::Config`] for `field`.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An [`Error::Data`] at a 1-based line of a text file.
    pub fn data_line(file: impl Into<PathBuf>, line: usize, message: impl Into<String>) -> Self {
        Error::Data {
            file: file.into(),
            location_kind: "line",
            location: line,
            message: message.into(),
        }
    }

    /// An [`Error::Data`] at a 1-based row of a columnar file.
    pub fn data_row(file: impl Into<PathBuf>, row: usize, message: impl Into<String>) -> Self {
        Error::Data {
            file: file.into(),
            location_kind: "row",
            location: row,
            message: message.into(),
        }
    }
}

/// The kinds of [`Error::WeightsDownload`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WeightsDownloadErrorKind {
    /// Not a `tinker://<run_id>/{weights|sampler_weights|external_weights}/<name>` path.
    InvalidPath,
    /// A sampler checkpoint (`sampler_weights`): these cannot be downloaded.
    SamplerCheckpoint,
    /// The service does not know the run or the checkpoint (HTTP 404).
    NotFound,
    /// The service refused or failed a request of the download (other than 404).
    Service,
    /// The training checkpoint could not be exported as external weights.
    Export,
    /// The checkpoint has no files, or a file went missing from re-signed URLs.
    MissingFiles,
    /// A file name would be written outside the output directory (path traversal), or is
    /// not a plain relative path.
    UnsafeFileName,
    /// A file of an encrypted export is not encrypted (no `.age` suffix).
    NotEncrypted,
    /// The transfer of a file failed (connection, HTTP status) after the retries.
    Transfer,
    /// A file's size differs from the size the storage announced.
    SizeMismatch,
    /// A file's digest differs from the digest the storage announced.
    DigestMismatch,
    /// A file could not be decrypted (wrong key, corrupt or truncated file).
    Decrypt,
    /// Writing the output failed (disk full, permissions, a path that is not a directory).
    Write,
}

/// An [`Error::WeightsDownload`].
#[cfg_attr(not(feature = "tinker"), allow(dead_code))]
pub(crate) fn download_error(
    tinker_path: &str,
    kind: WeightsDownloadErrorKind,
    file: Option<&str>,
    message: impl Into<String>,
) -> Error {
    Error::WeightsDownload {
        tinker_path: tinker_path.to_string(),
        kind,
        file: file.map(str::to_string),
        message: message.into(),
    }
}

impl From<tokenizers::Error> for Error {
    fn from(e: tokenizers::Error) -> Self {
        Error::Tokenizer(e.to_string())
    }
}
