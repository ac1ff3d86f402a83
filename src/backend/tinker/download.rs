//! Downloading trained weights, as tinker-cookbook 0.6.1's `weights.download`:
//! an external-weights export file by file from its signed URLs, or a training checkpoint
//! through a temporary export encrypted to a key made for the download.
//!
//! Each file is streamed to `<out>/.download-<random>/<name>.part`, resumed with a `Range`
//! request after a broken connection, checked (size, and a digest when the storage sends
//! one), renamed when complete; the files are moved into `<out>` only once every one of them
//! is complete, so a failed or killed download leaves no file that looks complete.

use std::io::{IsTerminal, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use md5::Digest as _;
use tokio::io::AsyncWriteExt;

use super::client::TinkerClient;
use super::config::{Secret, TinkerConfig};
use super::rest::{CheckpointKind, ExternalWeightsUrls, TinkerPath, TinkerRestClient};
use super::session::load_into_new_run;
use super::training::save_weights_external;
use crate::error::{Error, Result, WeightsDownloadErrorKind as Kind, download_error};

/// Signed URLs are renewed when they expire within this margin (as the cookbook).
const URL_REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// The lifetime of the temporary export of a training checkpoint (renewed on each signing).
const TEMPORARY_EXPORT_TTL_SECONDS: u64 = 3600;
/// The suffix of an age-encrypted file.
const AGE_SUFFIX: &str = ".age";
/// Re-signings of a file's URL after the storage refused it (expired, 401/403).
const MAX_RESIGNS: u32 = 3;

/// How [`download_weights`] behaves. The default: a progress bar on standard error when it is
/// a terminal, 5 retries per file after a failed transfer, no identity of your own.
///
/// ```
/// use rlvr::backend::tinker::DownloadOptions;
/// let opts = DownloadOptions::new().progress(false).max_retries(8);
/// assert_eq!(opts.retries(), 8);
/// ```
#[derive(Clone, Debug)]
pub struct DownloadOptions {
    progress: bool,
    max_retries: u32,
    age_identity: Option<Secret>,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            progress: true,
            max_retries: 5,
            age_identity: None,
        }
    }
}

impl DownloadOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Shows a progress bar (the default; it is drawn only when standard error is a
    /// terminal). `false` never shows one.
    pub fn progress(mut self, show: bool) -> Self {
        self.progress = show;
        self
    }

    /// Retries of a file's transfer after a failure (a broken connection, a 5xx, a timeout)
    /// without progress in between; each retry resumes where the data stopped.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// The retry budget set by [`max_retries`](Self::max_retries).
    pub fn retries(&self) -> u32 {
        self.max_retries
    }

    /// An age x25519 identity (`AGE-SECRET-KEY-1…`) to decrypt the `.age` files of an
    /// external-weights export saved with your recipient; they are written without the
    /// suffix. Without it such files are written encrypted, as the service stores them.
    pub fn age_identity(mut self, identity: impl Into<String>) -> Self {
        self.age_identity = Some(Secret::new(identity));
        self
    }
}

/// Downloads the checkpoint `tinker_path` into `out_dir` (created if needed) and returns
/// `out_dir`, as tinker-cookbook's `weights.download`:
///
/// - `tinker://<run>/external_weights/<name>` (from
///   [`TinkerBackend::save_weights_external`](super::TinkerBackend::save_weights_external)):
///   each file from its signed URL. Files of an encrypted export keep their `.age` suffix
///   unless [`DownloadOptions::age_identity`] decrypts them.
/// - `tinker://<run>/weights/<name>` (from `save_state`): the checkpoint is loaded into a
///   new training run (a session on the service, on the checkpoint's base model), exported
///   with `save_weights_external` encrypted to a key made for this download, downloaded,
///   decrypted, and the export deleted (a warning is logged if that fails; it expires after
///   an hour anyway).
/// - `tinker://<run>/sampler_weights/<name>`: refused; sampler checkpoints cannot be
///   downloaded.
///
/// File names are checked before anything is written (no absolute paths, no `..`). Every
/// file is checked against the size the storage announces, and against its digest when the
/// storage sends one (`x-goog-hash` MD5, `Content-MD5`, `x-amz-checksum-sha256`,
/// `Repr-Digest`/`Digest` SHA-256). Failures are [`Error::WeightsDownload`] with a
/// [`WeightsDownloadErrorKind`](crate::WeightsDownloadErrorKind); `out_dir` then holds no
/// new file.
///
/// ```no_run
/// # async fn run() -> rlvr::Result<()> {
/// use rlvr::backend::tinker::{download_weights, DownloadOptions, TinkerConfig};
/// let config = TinkerConfig::from_env()?;
/// let dir = download_weights(
///     &config,
///     "tinker://run-1:train:0/weights/final",
///     "./adapter",
///     &DownloadOptions::default(),
/// )
/// .await?;
/// println!("weights in {}", dir.display());
/// # Ok(()) }
/// ```
pub async fn download_weights(
    config: &TinkerConfig,
    tinker_path: &str,
    out_dir: impl AsRef<Path>,
    options: &DownloadOptions,
) -> Result<PathBuf> {
    let out_dir = out_dir.as_ref().to_path_buf();
    let parsed = TinkerPath::parse(tinker_path)?;
    if parsed.kind() == CheckpointKind::Sampler {
        return Err(download_error(
            tinker_path,
            Kind::SamplerCheckpoint,
            None,
            format!(
                "Sampler checkpoints cannot be downloaded: {tinker_path:?}. Download a training \
                 checkpoint (tinker://<run_id>/weights/<name>) or external weights saved with \
                 TrainingClient.save_weights_external() instead."
            ),
        ));
    }
    let user_identity = match &options.age_identity {
        Some(s) => Some(
            s.expose()
                .trim()
                .parse::<age::x25519::Identity>()
                .map_err(|e| {
                    Error::config("age_identity", format!("not an age x25519 identity: {e}"))
                })?,
        ),
        None => None,
    };
    let service = |e: Error| service_error(tinker_path, e, "Failed to connect to Tinker service");
    let rest = TinkerRestClient::connect(config).await.map_err(service)?;
    let progress = progress_bar(options.progress);
    let storage = storage_client(config)?;
    let mut job = Job {
        rest: &rest,
        storage,
        options,
        progress,
        backoff_scale: config.backoff_scale,
    };
    let result = match parsed.kind() {
        CheckpointKind::External => {
            let decrypt = user_identity.map(|id| Decrypt {
                identity: id,
                required: false,
            });
            job.download_external(tinker_path, &out_dir, None, decrypt.as_ref())
                .await
        }
        _ => job.download_training(config, tinker_path, &out_dir).await,
    };
    job.progress.finish_and_clear();
    result.map(|()| out_dir)
}

/// How the files of an export are decrypted.
struct Decrypt {
    identity: age::x25519::Identity,
    /// Every file must be encrypted (the temporary export of a training checkpoint).
    required: bool,
}

/// One download: the clients and options.
struct Job<'a> {
    rest: &'a TinkerRestClient,
    storage: reqwest::Client,
    options: &'a DownloadOptions,
    progress: ProgressBar,
    backoff_scale: f64,
}

/// The storage client: no credentials of the service (the signed URL is the credential), no
/// decompression (sizes are the stored bytes), a read timeout instead of a total one.
fn storage_client(config: &TinkerConfig) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .read_timeout(Duration::from_secs(120))
        .user_agent(concat!("rlvr/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| Error::Transport {
            endpoint: "storage".into(),
            message: format!("building the HTTP client: {e}"),
        })
}

fn progress_bar(show: bool) -> ProgressBar {
    if !show || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// A failed service call as an [`Error::WeightsDownload`]: 404 is
/// [`NotFound`](Kind::NotFound), anything else [`Service`](Kind::Service).
fn service_error(tinker_path: &str, e: Error, what: &str) -> Error {
    match e {
        Error::WeightsDownload { .. } => e,
        Error::Http { status: 404, .. } => {
            download_error(tinker_path, Kind::NotFound, None, format!("{what}: {e}"))
        }
        e => download_error(tinker_path, Kind::Service, None, format!("{what}: {e}")),
    }
}

fn write_error(tinker_path: &str, file: &str, op: &str, path: &Path, e: std::io::Error) -> Error {
    download_error(
        tinker_path,
        Kind::Write,
        Some(file).filter(|f| !f.is_empty()),
        format!("{op} {}: {e}", path.display()),
    )
}

/// `name` as a relative path, when it is a plain one: `/`-separated parts, none empty, `.`
/// or `..`, no root, no backslash or NUL.
fn safe_relative(name: &str) -> Option<PathBuf> {
    if name.is_empty() || name.contains('\0') || name.contains('\\') {
        return None;
    }
    if name.split('/').any(|part| matches!(part, "" | "." | "..")) {
        return None;
    }
    let p = Path::new(name);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Removes the staging directory when dropped (success or failure).
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("could not remove {}: {e}", self.0.display());
        }
    }
}

impl Job<'_> {
    /// The route of a training checkpoint: load into a new run, export encrypted to a fresh
    /// key, download and decrypt, delete the export; the session is finished in all cases.
    async fn download_training(
        &mut self,
        config: &TinkerConfig,
        tinker_path: &str,
        out_dir: &Path,
    ) -> Result<()> {
        let client = TinkerClient::open_session(
            Arc::clone(&self.rest.http),
            self.rest.server.clone(),
            config,
        )
        .await
        .map_err(|e| service_error(tinker_path, e, "Failed to connect to Tinker service"))?;
        let result = self
            .export_and_download(&client, tinker_path, out_dir)
            .await;
        let status = if result.is_ok() { "success" } else { "errored" };
        if let Err(e) = client.close_with(status).await {
            tracing::warn!("Failed to close the Tinker client: {e}");
        }
        result
    }

    async fn export_and_download(
        &mut self,
        client: &TinkerClient,
        tinker_path: &str,
        out_dir: &Path,
    ) -> Result<()> {
        let identity = age::x25519::Identity::generate();
        let recipient = identity.to_public().to_string();
        let failed = |kind: Kind, e: Error| {
            download_error(
                tinker_path,
                kind,
                None,
                format!("Failed to export {tinker_path:?} as external weights: {e}"),
            )
        };
        let metadata = serde_json::json!({"created_by": "tinker_cookbook.weights.download"});
        let (model_id, _info) = load_into_new_run(
            &client.session,
            tinker_path,
            Some(&metadata),
            "ServiceClient.create_training_client_from_state",
        )
        .await
        .map_err(|e| match e {
            // No such run or checkpoint.
            Error::Http { status: 404, .. } => failed(Kind::NotFound, e),
            e => failed(Kind::Export, e),
        })?;
        let export_path = save_weights_external(
            &client.session,
            &model_id,
            1,
            "download",
            Some(TEMPORARY_EXPORT_TTL_SECONDS),
            &[recipient],
            |_| {},
        )
        .await
        .map_err(|e| failed(Kind::Export, e))?;
        let decrypt = Decrypt {
            identity,
            required: true,
        };
        let result = self
            .download_external(
                &export_path,
                out_dir,
                Some(TEMPORARY_EXPORT_TTL_SECONDS),
                Some(&decrypt),
            )
            .await;
        if let Err(e) = self.rest.delete_checkpoint(&export_path).await {
            tracing::warn!(
                "Failed to delete the temporary export {export_path}. It expires in \
                 {TEMPORARY_EXPORT_TTL_SECONDS} seconds. ({e})"
            );
        }
        result
    }

    /// Signs the URLs; with `renew_ttl`, then resets the checkpoint's TTL (after signing, so
    /// the checkpoint outlives the URLs; a failure is only logged).
    async fn sign(&self, tinker_path: &str, renew_ttl: Option<u64>) -> Result<ExternalWeightsUrls> {
        let urls = self
            .rest
            .external_weights_urls(tinker_path)
            .await
            .map_err(|e| {
                service_error(
                    tinker_path,
                    e,
                    &format!("Failed to get download URLs for {tinker_path:?}"),
                )
            })?;
        if let Some(ttl) = renew_ttl
            && let Err(e) = self.rest.set_checkpoint_ttl(tinker_path, Some(ttl)).await
        {
            tracing::warn!("Failed to renew the TTL of {tinker_path}: {e}");
        }
        Ok(urls)
    }

    /// Downloads every file of an external-weights checkpoint into `out_dir`.
    async fn download_external(
        &mut self,
        tinker_path: &str,
        out_dir: &Path,
        renew_ttl: Option<u64>,
        decrypt: Option<&Decrypt>,
    ) -> Result<()> {
        let mut urls = self.sign(tinker_path, renew_ttl).await?;
        if urls.urls.is_empty() {
            return Err(download_error(
                tinker_path,
                Kind::MissingFiles,
                None,
                format!("External weights checkpoint {tinker_path:?} has no files."),
            ));
        }
        // Every name checked before anything is written.
        let mut plan: Vec<(String, PathBuf, bool)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for name in urls.urls.keys() {
            let encrypted = name.ends_with(AGE_SUFFIX);
            let decrypts = decrypt.is_some() && encrypted;
            if decrypt.is_some_and(|d| d.required) && !encrypted {
                return Err(download_error(
                    tinker_path,
                    Kind::NotEncrypted,
                    Some(name),
                    format!("{name:?} in {tinker_path:?} is not encrypted."),
                ));
            }
            let output_name = if decrypts {
                &name[..name.len() - AGE_SUFFIX.len()]
            } else {
                name.as_str()
            };
            let rel = safe_relative(output_name)
                .filter(|_| safe_relative(name).is_some())
                .ok_or_else(|| {
                    download_error(
                        tinker_path,
                        Kind::UnsafeFileName,
                        Some(name),
                        format!(
                            "Unsafe file path {name:?} in external weights checkpoint (path \
                             traversal); nothing was written to {}",
                            out_dir.display()
                        ),
                    )
                })?;
            if !seen.insert(rel.clone()) {
                return Err(download_error(
                    tinker_path,
                    Kind::UnsafeFileName,
                    Some(name),
                    format!(
                        "two files of {tinker_path:?} would be written to {}",
                        rel.display()
                    ),
                ));
            }
            plan.push((name.clone(), rel, decrypts));
        }

        let created_out = !out_dir.exists();
        tokio::fs::create_dir_all(out_dir)
            .await
            .map_err(|e| write_error(tinker_path, "", "creating directory", out_dir, e))?;
        let result = self
            .fetch_all(tinker_path, out_dir, renew_ttl, decrypt, &mut urls, &plan)
            .await;
        if result.is_err() && created_out {
            // Only removes it when it is still empty.
            let _ = std::fs::remove_dir(out_dir);
        }
        result
    }

    async fn fetch_all(
        &mut self,
        tinker_path: &str,
        out_dir: &Path,
        renew_ttl: Option<u64>,
        decrypt: Option<&Decrypt>,
        urls: &mut ExternalWeightsUrls,
        plan: &[(String, PathBuf, bool)],
    ) -> Result<()> {
        let staging_dir = out_dir.join(format!(".download-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&staging_dir)
            .map_err(|e| write_error(tinker_path, "", "creating directory", &staging_dir, e))?;
        let staging = Staging(staging_dir);
        for (name, rel, decrypts) in plan {
            let expiring = urls
                .expires
                .is_some_and(|t| SystemTime::now() + URL_REFRESH_MARGIN >= t);
            if expiring {
                *urls = self.sign(tinker_path, renew_ttl).await?;
            }
            let staged = staging.0.join(rel);
            let fetched = if *decrypts {
                staging.0.join(name)
            } else {
                staged.clone()
            };
            for p in [&staged, &fetched] {
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| {
                        write_error(tinker_path, name, "creating directory", parent, e)
                    })?;
                }
            }
            let part = part_path(&fetched);
            self.fetch_file(tinker_path, name, &part, urls, renew_ttl)
                .await?;
            rename(tinker_path, name, &part, &fetched)?;
            if let (true, Some(d)) = (*decrypts, decrypt) {
                let staged_part = part_path(&staged);
                decrypt_file(tinker_path, name, &fetched, &staged_part, &d.identity).await?;
                rename(tinker_path, name, &staged_part, &staged)?;
                std::fs::remove_file(&fetched)
                    .map_err(|e| write_error(tinker_path, name, "removing", &fetched, e))?;
            }
        }
        for (name, rel, _) in plan {
            let dest = out_dir.join(rel);
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| write_error(tinker_path, name, "creating directory", parent, e))?;
            }
            rename(tinker_path, name, &staging.0.join(rel), &dest)?;
        }
        Ok(())
    }

    /// Signs the URLs again after the storage refused `name`'s (at most [`MAX_RESIGNS`]
    /// times a file).
    async fn resign(
        &self,
        tinker_path: &str,
        name: &str,
        status: u16,
        resigns: &mut u32,
        urls: &mut ExternalWeightsUrls,
        renew_ttl: Option<u64>,
    ) -> Result<()> {
        if *resigns >= MAX_RESIGNS {
            return Err(download_error(
                tinker_path,
                Kind::Transfer,
                Some(name),
                format!(
                    "the storage refused the signed URL of {name:?} (HTTP {status}) after \
                     {resigns} re-signings"
                ),
            ));
        }
        *resigns += 1;
        tracing::debug!("{name}: HTTP {status} from the storage; signing the URLs again");
        *urls = self.sign(tinker_path, renew_ttl).await?;
        Ok(())
    }

    /// Transfers one file into `part`: resumes with `Range` after a failure, re-signs the
    /// URL when the storage refuses it, checks the size and the digest.
    async fn fetch_file(
        &mut self,
        tinker_path: &str,
        name: &str,
        part: &Path,
        urls: &mut ExternalWeightsUrls,
        renew_ttl: Option<u64>,
    ) -> Result<()> {
        let err =
            |kind: Kind, message: String| download_error(tinker_path, kind, Some(name), message);
        let mut file = tokio::fs::File::create(part)
            .await
            .map_err(|e| write_error(tinker_path, name, "creating", part, e))?;
        let mut have: u64 = 0;
        let mut total: Option<u64> = None;
        let mut digest: Option<Checksum> = None;
        let mut failures: u32 = 0;
        let mut resigns: u32 = 0;
        self.progress.set_message(name.to_string());
        self.progress.set_position(0);
        self.progress.set_length(0);
        loop {
            let url = urls.urls.get(name).cloned().ok_or_else(|| {
                err(
                    Kind::MissingFiles,
                    format!("{name:?} is missing from the re-signed URLs for {tinker_path:?}."),
                )
            })?;
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(err(Kind::Transfer, format!("{name:?} has no HTTP(S) URL")));
            }
            let mut req = self.storage.get(&url);
            if have > 0 {
                req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
            }
            // `Err(message)`: a transient failure, retried.
            let attempt: std::result::Result<bool, String> = match req.send().await {
                Err(e) => Err(strip(&e)),
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let headers = resp.headers().clone();
                    // An expired or refused signature: 401/403 (S3 says `Request has expired`
                    // with 403), or a 400 that says it expired (`ExpiredToken`, GCS).
                    if status == 400 {
                        let body = resp.text().await.unwrap_or_default();
                        if !body.to_ascii_lowercase().contains("expired") {
                            return Err(err(
                                Kind::Transfer,
                                format!("HTTP 400 from the signed URL of {name:?}"),
                            ));
                        }
                        self.resign(tinker_path, name, status, &mut resigns, urls, renew_ttl)
                            .await?;
                        continue;
                    }
                    if matches!(status, 401 | 403) {
                        self.resign(tinker_path, name, status, &mut resigns, urls, renew_ttl)
                            .await?;
                        continue;
                    }
                    if status == 416 && total == Some(have) {
                        Ok(true)
                    } else if status >= 500 || matches!(status, 408 | 429) {
                        Err(format!("HTTP {status}"))
                    } else if status == 200 || status == 206 {
                        let announced = if status == 206 {
                            match content_range(&headers) {
                                Some((start, t)) if start == have => t,
                                _ => {
                                    // Not the range asked for: start over.
                                    have = 0;
                                    file = restart(tinker_path, name, part, file).await?;
                                    failures += 1;
                                    if failures > self.options.max_retries {
                                        return Err(err(
                                            Kind::Transfer,
                                            "the storage answered ranges that were not asked for"
                                                .into(),
                                        ));
                                    }
                                    continue;
                                }
                            }
                        } else {
                            if have > 0 {
                                // The whole file again: start over.
                                have = 0;
                                file = restart(tinker_path, name, part, file).await?;
                            }
                            resp.content_length()
                        };
                        if let (Some(t), Some(a)) = (total, announced)
                            && t != a
                        {
                            return Err(err(
                                Kind::SizeMismatch,
                                format!(
                                    "the storage announced {a} bytes for {name:?}, earlier {t}"
                                ),
                            ));
                        }
                        total = total.or(announced);
                        if let Some(t) = total {
                            self.progress.set_length(t);
                        }
                        if digest.is_none() {
                            digest = checksum(&headers, status == 200);
                        }
                        let before = have;
                        let mut body = resp.bytes_stream();
                        let mut outcome = Ok(true);
                        while let Some(chunk) = body.next().await {
                            match chunk {
                                Ok(bytes) => {
                                    let n = bytes.len() as u64;
                                    if total.is_some_and(|t| have + n > t) {
                                        return Err(err(
                                            Kind::SizeMismatch,
                                            format!(
                                                "{name:?} is longer than the {} bytes the storage announced",
                                                total.unwrap_or(0)
                                            ),
                                        ));
                                    }
                                    file.write_all(&bytes).await.map_err(|e| {
                                        write_error(tinker_path, name, "writing", part, e)
                                    })?;
                                    have += n;
                                    self.progress.set_position(have);
                                }
                                Err(e) => {
                                    outcome = Err(strip(&e));
                                    break;
                                }
                            }
                        }
                        if outcome.is_ok() && total.is_some_and(|t| have < t) {
                            outcome = Err(format!("the connection closed after {have} bytes"));
                        }
                        if have > before {
                            failures = 0;
                        }
                        outcome
                    } else {
                        let kind = if status == 404 {
                            Kind::MissingFiles
                        } else {
                            Kind::Transfer
                        };
                        return Err(err(
                            kind,
                            format!("HTTP {status} from the signed URL of {name:?}"),
                        ));
                    }
                }
            };
            match attempt {
                Ok(_) => break,
                Err(message) => {
                    failures += 1;
                    if failures > self.options.max_retries {
                        return Err(err(
                            Kind::Transfer,
                            format!(
                                "Failed to download {name:?} from its signed URL after {} retries: {message}",
                                self.options.max_retries
                            ),
                        ));
                    }
                    let d = Duration::from_millis(500 * (1u64 << (failures - 1).min(4)));
                    let d = Duration::try_from_secs_f64(d.as_secs_f64() * self.backoff_scale)
                        .unwrap_or(d);
                    tracing::debug!("{name}: {message}; resuming at byte {have} in {d:?}");
                    tokio::time::sleep(d).await;
                }
            }
        }
        file.flush()
            .await
            .map_err(|e| write_error(tinker_path, name, "writing", part, e))?;
        file.sync_all()
            .await
            .map_err(|e| write_error(tinker_path, name, "syncing", part, e))?;
        drop(file);
        if let Some(t) = total
            && have != t
        {
            return Err(err(
                Kind::SizeMismatch,
                format!("{name:?} has {have} bytes, the storage announced {t}"),
            ));
        }
        if let Some(expected) = digest {
            let path = part.to_path_buf();
            let got = tokio::task::spawn_blocking(move || expected.compute(&path))
                .await
                .map_err(|e| Error::Backend(format!("digest task: {e}")))?
                .map_err(|e| write_error(tinker_path, name, "reading", part, e))?;
            if got != expected {
                return Err(err(
                    Kind::DigestMismatch,
                    format!(
                        "{name:?}: {} digest {} expected, got {}",
                        expected.algorithm(),
                        expected.hex(),
                        got.hex()
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn part_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

fn rename(tinker_path: &str, name: &str, from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| {
        write_error(
            tinker_path,
            name,
            &format!("moving {} to", from.display()),
            to,
            e,
        )
    })
}

/// Truncates `part` to start over (after the old handle's buffered writes are done, so none
/// lands after the truncation).
async fn restart(
    tinker_path: &str,
    name: &str,
    part: &Path,
    mut file: tokio::fs::File,
) -> Result<tokio::fs::File> {
    file.flush()
        .await
        .map_err(|e| write_error(tinker_path, name, "writing", part, e))?;
    drop(file);
    tokio::fs::File::create(part)
        .await
        .map_err(|e| write_error(tinker_path, name, "creating", part, e))
}

/// `Content-Range: bytes <start>-<end>/<total|*>` → (start, total).
fn content_range(headers: &reqwest::header::HeaderMap) -> Option<(u64, Option<u64>)> {
    let v = headers.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((start.trim().parse().ok()?, total))
}

/// The reqwest error without the signed URL's query (the signature).
fn strip(e: &reqwest::Error) -> String {
    super::http::strip_url(e)
}

/// A whole-file digest announced by the storage.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Checksum {
    Md5([u8; 16]),
    Sha256([u8; 32]),
}

impl Checksum {
    fn algorithm(&self) -> &'static str {
        match self {
            Checksum::Md5(_) => "MD5",
            Checksum::Sha256(_) => "SHA-256",
        }
    }
    fn hex(&self) -> String {
        let b: &[u8] = match self {
            Checksum::Md5(b) => b,
            Checksum::Sha256(b) => b,
        };
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
    /// The same digest of the file at `path`.
    fn compute(&self, path: &Path) -> std::io::Result<Checksum> {
        let mut f = std::fs::File::open(path)?;
        let mut buf = vec![0u8; 1 << 20];
        match self {
            Checksum::Md5(_) => {
                let mut h = md5::Md5::new();
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                }
                Ok(Checksum::Md5(h.finalize().into()))
            }
            Checksum::Sha256(_) => {
                let mut h = sha2::Sha256::new();
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                }
                Ok(Checksum::Sha256(h.finalize().into()))
            }
        }
    }
}

/// The whole-file digest in `headers`: `x-goog-hash: …md5=<b64>` (Google Cloud Storage),
/// `x-amz-checksum-sha256: <b64>` (S3, whole-object checksums), `Repr-Digest:
/// sha-256=:<b64>:` / `Digest: sha-256=<b64>`, and `Content-MD5` on a whole-file (200)
/// answer. CRC checksums are not checked.
fn checksum(headers: &reqwest::header::HeaderMap, whole: bool) -> Option<Checksum> {
    let b64 = |s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .ok()
    };
    let md5 = |s: &str| {
        b64(s)
            .and_then(|v| <[u8; 16]>::try_from(v).ok())
            .map(Checksum::Md5)
    };
    let sha = |s: &str| {
        b64(s)
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .map(Checksum::Sha256)
    };
    let text = |name: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
    };
    for v in text("x-goog-hash") {
        for part in v.split(',') {
            if let Some(d) = part.trim().strip_prefix("md5=").and_then(md5) {
                return Some(d);
            }
        }
    }
    if let Some(d) = text("x-amz-checksum-sha256").first().and_then(|v| sha(v)) {
        return Some(d);
    }
    for v in text("repr-digest") {
        for part in v.split(',') {
            if let Some(d) = part
                .trim()
                .strip_prefix("sha-256=:")
                .and_then(|s| s.strip_suffix(':'))
                .and_then(sha)
            {
                return Some(d);
            }
        }
    }
    for v in text("digest") {
        for part in v.split(',') {
            let (alg, val) = part.trim().split_once('=')?;
            if alg.eq_ignore_ascii_case("sha-256")
                && let Some(d) = sha(val)
            {
                return Some(d);
            }
        }
    }
    if whole && let Some(d) = text("content-md5").first().and_then(|v| md5(v)) {
        return Some(d);
    }
    None
}

/// Decrypts the age file `from` into `to` with `identity`.
async fn decrypt_file(
    tinker_path: &str,
    name: &str,
    from: &Path,
    to: &Path,
    identity: &age::x25519::Identity,
) -> Result<()> {
    let (from_p, to_p, identity) = (from.to_path_buf(), to.to_path_buf(), identity.clone());
    let (tp, n) = (tinker_path.to_string(), name.to_string());
    tokio::task::spawn_blocking(move || -> Result<()> {
        let decrypt_err = |m: String| {
            download_error(
                &tp,
                Kind::Decrypt,
                Some(&n),
                format!("Failed to decrypt {n:?}: {m}"),
            )
        };
        let input = std::fs::File::open(&from_p)
            .map_err(|e| write_error(&tp, &n, "opening", &from_p, e))?;
        let decryptor = age::Decryptor::new(std::io::BufReader::new(input))
            .map_err(|e| decrypt_err(e.to_string()))?;
        let mut reader = decryptor
            .decrypt(std::iter::once(&identity as &dyn age::Identity))
            .map_err(|e| decrypt_err(e.to_string()))?;
        let mut out =
            std::fs::File::create(&to_p).map_err(|e| write_error(&tp, &n, "creating", &to_p, e))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let k = reader
                .read(&mut buf)
                .map_err(|e| decrypt_err(e.to_string()))?;
            if k == 0 {
                break;
            }
            out.write_all(&buf[..k])
                .map_err(|e| write_error(&tp, &n, "writing", &to_p, e))?;
        }
        out.sync_all()
            .map_err(|e| write_error(&tp, &n, "syncing", &to_p, e))?;
        Ok(())
    })
    .await
    .map_err(|e| Error::Backend(format!("decryption task: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_names_are_refused() {
        for bad in [
            "",
            "../x",
            "a/../../x",
            "/etc/passwd",
            "./a",
            "a/./b",
            "a\\..\\b",
            "a\0b",
        ] {
            assert!(safe_relative(bad).is_none(), "{bad:?}");
        }
        assert_eq!(
            safe_relative("a/b.safetensors"),
            Some(PathBuf::from("a/b.safetensors"))
        );
        assert_eq!(safe_relative("a//b"), None);
    }

    #[test]
    fn content_ranges() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            reqwest::header::CONTENT_RANGE,
            "bytes 100-199/1000".parse().unwrap(),
        );
        assert_eq!(content_range(&h), Some((100, Some(1000))));
        h.insert(
            reqwest::header::CONTENT_RANGE,
            "bytes 5-9/*".parse().unwrap(),
        );
        assert_eq!(content_range(&h), Some((5, None)));
    }

    #[test]
    fn digests_from_headers() {
        let mut h = reqwest::header::HeaderMap::new();
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e.
        h.insert(
            "x-goog-hash",
            "crc32c=AAAAAA==,md5=1B2M2Y8AsgTpgAmY7PhCfg=="
                .parse()
                .unwrap(),
        );
        let d = checksum(&h, false).unwrap();
        assert_eq!(d.hex(), "d41d8cd98f00b204e9800998ecf8427e");
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==".parse().unwrap());
        assert!(checksum(&h, false).is_none());
        assert!(checksum(&h, true).is_some());
    }
}
