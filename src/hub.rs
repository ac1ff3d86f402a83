//! Downloads from the Hugging Face hub (or any endpoint that speaks its `resolve` protocol),
//! cached in the hub's standard layout (feature `hub`).
//!
//! The cache is the one the Python `huggingface_hub` library uses:
//! `{cache}/{models|datasets}--{org}--{name}/{blobs,refs,snapshots}`, so files downloaded by
//! Python are reused here and the other way round. A file already in the cache is returned
//! without any request (it is not revalidated). Downloads go through [`hf_hub`]'s tokio API
//! (a temporary file renamed into place, so an interrupted download never leaves a truncated
//! file behind).
//!
//! Settings not given in [`HubOptions`] follow the environment, like `huggingface_hub`:
//!
//! | setting | environment | default |
//! |---|---|---|
//! | endpoint | `HF_ENDPOINT` | `https://huggingface.co` |
//! | cache directory | `HF_HUB_CACHE`, else `$HF_HOME/hub` | `~/.cache/huggingface/hub` (`$XDG_CACHE_HOME/huggingface/hub` when set) |
//! | token | `HF_TOKEN`, else the file `$HF_HOME/token` (or `HF_TOKEN_PATH`) | none |
//! | offline (cache only) | `HF_HUB_OFFLINE=1` | off |
//!
//! ```no_run
//! use rlvr::hub::{Hub, HubOptions, HubRepo};
//!
//! # async fn run() -> rlvr::Result<()> {
//! let hub = Hub::new(&HubOptions::default())?;
//! let config = hub.get(&HubRepo::model("Qwen/Qwen3-0.6B"), "config.json").await?;
//! println!("cached at {}", config.display());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use hf_hub::api::tokio::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};

use crate::error::{Error, Result};

/// The public Hugging Face hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to download. Every `None` field follows the environment (see the
/// [module documentation](self)).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HubOptions {
    /// The hub endpoint, e.g. `https://huggingface.co` or a mirror.
    pub endpoint: Option<String>,
    /// The cache directory (the `hub` directory itself, like `HF_HUB_CACHE`).
    pub cache_dir: Option<PathBuf>,
    /// An access token for gated or private repositories. Never printed.
    pub token: Option<String>,
    /// Only use the cache; a file that is not cached is an error.
    pub offline: Option<bool>,
    /// Show a progress bar while downloading.
    pub progress: bool,
}

impl fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubOptions")
            .field("endpoint", &self.endpoint)
            .field("cache_dir", &self.cache_dir)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("offline", &self.offline)
            .field("progress", &self.progress)
            .finish()
    }
}

impl HubOptions {
    /// Options with an explicit endpoint (builder style).
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Options with an explicit cache directory (builder style).
    pub fn with_cache_dir(mut self, cache_dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(cache_dir.into());
        self
    }

    /// Options with an explicit token (builder style).
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Options with offline mode on or off (builder style).
    pub fn with_offline(mut self, offline: bool) -> Self {
        self.offline = Some(offline);
        self
    }
}

/// The kind of a hub repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RepoKind {
    /// A model (`/{id}/resolve/...`).
    Model,
    /// A dataset (`/datasets/{id}/resolve/...`).
    Dataset,
    /// A space (`/spaces/{id}/resolve/...`).
    Space,
}

/// A repository at a revision.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HubRepo {
    /// `org/name`.
    pub id: String,
    /// Model, dataset or space.
    pub kind: RepoKind,
    /// A branch, tag or commit hash (`main` by default).
    pub revision: String,
}

impl HubRepo {
    /// A repository of `kind` at revision `main`.
    pub fn new(id: impl Into<String>, kind: RepoKind) -> Self {
        HubRepo {
            id: id.into(),
            kind,
            revision: "main".to_string(),
        }
    }

    /// A model repository at `main`.
    pub fn model(id: impl Into<String>) -> Self {
        Self::new(id, RepoKind::Model)
    }

    /// A dataset repository at `main`.
    pub fn dataset(id: impl Into<String>) -> Self {
        Self::new(id, RepoKind::Dataset)
    }

    /// The same repository at another revision (builder style).
    pub fn with_revision(mut self, revision: impl Into<String>) -> Self {
        self.revision = revision.into();
        self
    }

    fn to_hf(&self) -> Repo {
        let kind = match self.kind {
            RepoKind::Model => RepoType::Model,
            RepoKind::Dataset => RepoType::Dataset,
            RepoKind::Space => RepoType::Space,
        };
        Repo::with_revision(self.id.clone(), kind, self.revision.clone())
    }
}

/// Settings after the environment has been consulted.
#[derive(Clone, PartialEq, Eq)]
struct Resolved {
    endpoint: String,
    cache_dir: PathBuf,
    token: Option<String>,
    offline: bool,
}

impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hub")
            .field("endpoint", &self.endpoint)
            .field("cache_dir", &self.cache_dir)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("offline", &self.offline)
            .finish()
    }
}

/// Fills the unset fields of `options` from `env` (a lookup of environment variables).
fn resolve(options: &HubOptions, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved> {
    // Empty variables count as unset, as in huggingface_hub.
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let endpoint = options
        .endpoint
        .clone()
        .or_else(|| var("HF_ENDPOINT"))
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
        .trim_end_matches('/')
        .to_string();
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(Error::config(
            "endpoint",
            format!("`{endpoint}` is not an http(s) URL"),
        ));
    }
    let home_dir = var("HOME")
        .or_else(|| var("USERPROFILE"))
        .map(PathBuf::from);
    let hf_home = var("HF_HOME").map(PathBuf::from).or_else(|| {
        var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| home_dir.map(|h| h.join(".cache")))
            .map(|c| c.join("huggingface"))
    });
    let cache_dir = options
        .cache_dir
        .clone()
        .or_else(|| var("HF_HUB_CACHE").map(PathBuf::from))
        .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
        .ok_or_else(|| {
            Error::config(
                "cache_dir",
                "no HF_HUB_CACHE, HF_HOME or home directory to put the hub cache in; \
                 set HubOptions::cache_dir",
            )
        })?;
    let token_file = var("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .or_else(|| hf_home.as_ref().map(|h| h.join("token")));
    let token = options
        .token
        .clone()
        .or_else(|| var("HF_TOKEN"))
        .or_else(|| {
            let text = std::fs::read_to_string(token_file?).ok()?;
            let text = text.trim();
            (!text.is_empty()).then(|| text.to_string())
        });
    let offline = options.offline.unwrap_or_else(|| {
        var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
    });
    Ok(Resolved {
        endpoint,
        cache_dir,
        token,
        offline,
    })
}

/// A configured hub client with its cache. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    api: Api,
    cache: Cache,
    resolved: Resolved,
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.resolved.fmt(f)
    }
}

impl Hub {
    /// A client for `options`, the unset fields taken from the environment.
    ///
    /// Errors: [`Error::Config`] for an endpoint that is not an http(s) URL, a token that
    /// cannot be sent in a header, or no cache directory at all.
    pub fn new(options: &HubOptions) -> Result<Self> {
        let resolved = resolve(options, &|name| std::env::var(name).ok())?;
        let cache = Cache::new(resolved.cache_dir.clone());
        let api = ApiBuilder::from_cache(cache.clone())
            .with_endpoint(resolved.endpoint.clone())
            .with_cache_dir(resolved.cache_dir.clone())
            .with_token(resolved.token.clone())
            .with_progress(options.progress)
            .with_user_agent("rlvr", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| match e {
                ApiError::InvalidHeaderValue(_) => {
                    Error::config("token", "the token cannot be sent as an HTTP header")
                }
                other => Error::config("hub", error_chain(&other)),
            })?;
        Ok(Hub {
            api,
            cache,
            resolved,
        })
    }

    /// The endpoint requests go to.
    pub fn endpoint(&self) -> &str {
        &self.resolved.endpoint
    }

    /// The cache directory.
    pub fn cache_dir(&self) -> &Path {
        &self.resolved.cache_dir
    }

    /// Whether only the cache is used.
    pub fn is_offline(&self) -> bool {
        self.resolved.offline
    }

    /// The cached copy of `file` for `repo`'s revision, if any. Makes no request.
    pub fn cached(&self, repo: &HubRepo, file: &str) -> Option<PathBuf> {
        self.cache.repo(repo.to_hf()).get(file)
    }

    /// The local path of `file` in `repo`: the cached copy, or a fresh download into the
    /// cache.
    ///
    /// Errors: [`Error::Hub`] naming the repository and file (not found, access denied,
    /// network failure, an endpoint that does not speak the hub protocol, or a file missing
    /// from the cache in offline mode).
    pub async fn get(&self, repo: &HubRepo, file: &str) -> Result<PathBuf> {
        if let Some(path) = self.cached(repo, file) {
            return Ok(path);
        }
        if self.resolved.offline {
            return Err(self.error(
                repo,
                file,
                format!(
                    "not in the cache {} and offline mode is on (HF_HUB_OFFLINE)",
                    self.resolved.cache_dir.display()
                ),
            ));
        }
        self.download(repo, file)
            .await
            .map_err(|(message, _)| self.error(repo, file, message))
    }

    /// Like [`get`](Self::get), but a file the hub reports as missing (HTTP 404) is
    /// `Ok(None)`. The absence is remembered in the cache (`.no_exist`, as `huggingface_hub`
    /// does) once the revision's commit is known, so asking again makes no request. In
    /// offline mode a file that is not cached is `Ok(None)`.
    pub async fn get_optional(&self, repo: &HubRepo, file: &str) -> Result<Option<PathBuf>> {
        if let Some(path) = self.cached(repo, file) {
            return Ok(Some(path));
        }
        let marker = self.no_exist_marker(repo, file);
        if marker.as_ref().is_some_and(|m| m.is_file()) || self.resolved.offline {
            return Ok(None);
        }
        match self.download(repo, file).await {
            Ok(path) => Ok(Some(path)),
            Err((_, Some(404))) => {
                // The ref may have been written by this very session's earlier downloads.
                if let Some(marker) = marker.or_else(|| self.no_exist_marker(repo, file)) {
                    let written = marker
                        .parent()
                        .map(std::fs::create_dir_all)
                        .transpose()
                        .and_then(|_| std::fs::write(&marker, b""));
                    if let Err(e) = written {
                        tracing::debug!("could not record {}: {e}", marker.display());
                    }
                }
                Ok(None)
            }
            Err((message, _)) => Err(self.error(repo, file, message)),
        }
    }

    /// `{repo dir}/.no_exist/{commit}/{file}` when the commit of `repo.revision` is known.
    fn no_exist_marker(&self, repo: &HubRepo, file: &str) -> Option<PathBuf> {
        let repo_dir = self.resolved.cache_dir.join(repo.to_hf().folder_name());
        let is_commit =
            repo.revision.len() == 40 && repo.revision.chars().all(|c| c.is_ascii_hexdigit());
        let commit = if is_commit {
            repo.revision.clone()
        } else {
            let text = std::fs::read_to_string(repo_dir.join("refs").join(&repo.revision)).ok()?;
            text.trim().to_string()
        };
        if commit.is_empty() {
            return None;
        }
        Some(repo_dir.join(".no_exist").join(commit).join(file))
    }

    /// Downloads `file`; the error is a message and the HTTP status when there was one.
    async fn download(
        &self,
        repo: &HubRepo,
        file: &str,
    ) -> std::result::Result<PathBuf, (String, Option<u16>)> {
        let api_repo = self.api.repo(repo.to_hf());
        let url = api_repo.url(file);
        tracing::info!("downloading {url}");
        api_repo.download(file).await.map_err(|e| match &e {
            ApiError::RequestError(re) => match re.status() {
                Some(status) => {
                    let code = status.as_u16();
                    let message = match code {
                        404 => format!("not found (HTTP 404) at {url}"),
                        401 | 403 => format!(
                            "access denied (HTTP {code}) at {url}: the repository may be \
                             gated or private; set HF_TOKEN"
                        ),
                        _ => format!("HTTP {code} from {url}"),
                    };
                    (message, Some(code))
                }
                None => (
                    format!("request to {url} failed: {}", error_chain(re)),
                    None,
                ),
            },
            ApiError::MissingHeader(header) => (
                format!(
                    "the response from {url} has no `{header}` header (is {} a Hugging Face \
                     hub endpoint?)",
                    self.resolved.endpoint
                ),
                None,
            ),
            other => (format!("{url}: {}", error_chain(other)), None),
        })
    }

    fn error(&self, repo: &HubRepo, file: &str, message: String) -> Error {
        let repo_name = if repo.revision == "main" {
            repo.id.clone()
        } else {
            format!("{}@{}", repo.id, repo.revision)
        };
        Error::Hub {
            repo: repo_name,
            file: file.to_string(),
            message,
        }
    }
}

/// An error and its sources, joined with `: `.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

impl Hub {
    /// Downloads a model repository's files into the cache, or reuses the cached ones, and
    /// returns the snapshot directory that holds them all: `config.json`, the weights
    /// (`model.safetensors`, or `model.safetensors.index.json` and every shard it names) and
    /// whichever of the tokenizer, chat-template, processor and generation-config files the
    /// repository has. What [`LocalBackend::from_pretrained`](crate::backend::local::LocalBackend::from_pretrained)
    /// loads and what the [`weights`](crate::weights) exporters take as a base model.
    ///
    /// Errors: [`Error::Hub`] naming the repository and file that could not be downloaded,
    /// or a revision that moved during the download.
    pub async fn model_snapshot(&self, repo: &HubRepo) -> Result<PathBuf> {
        let hub = self;
        let config = hub.get(repo, "config.json").await?;
        let dir = config
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| hub_error(repo, "config.json", "the cached file has no directory"))?;
        let mut files = Vec::new();
        let optional = crate::tokenizer::TOKENIZER_AND_PROCESSOR_FILES
            .iter()
            .chain(&["generation_config.json"]);
        for name in optional {
            if let Some(p) = hub.get_optional(repo, name).await? {
                files.push((name.to_string(), p));
            }
        }
        match hub.get_optional(repo, "model.safetensors").await? {
            Some(p) => files.push(("model.safetensors".to_string(), p)),
            None => {
                let name = "model.safetensors.index.json";
                let index = hub.get(repo, name).await?;
                for shard in shard_names(&index)? {
                    let path = hub.get(repo, &shard).await?;
                    files.push((shard, path));
                }
                files.push((name.to_string(), index));
            }
        }
        // Every file must come from the same snapshot (the revision may move between requests).
        for (name, path) in &files {
            if path.parent() != Some(dir.as_path()) {
                return Err(hub_error(
                    repo,
                    name,
                    format!(
                        "cached in {} but config.json in {}: the revision changed during the \
                     download; pin a commit with HubRepo::with_revision",
                        path.display(),
                        dir.display()
                    ),
                ));
            }
        }
        Ok(dir)
    }
}

/// The distinct shard files of a `model.safetensors.index.json`, in order of appearance.
fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io("reading", index, e))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::data_line(index, e.line(), e.to_string()))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::data_line(index, 0, "no `weight_map` object in the index"))?;
    let mut names: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::data_line(index, 0, format!("weight_map.{tensor} is not a file name"))
        })?;
        if file.contains("..") || file.starts_with('/') {
            return Err(Error::data_line(
                index,
                0,
                format!("weight_map.{tensor}: `{file}` is not a file of the repository"),
            ));
        }
        if !names.iter().any(|n| n == file) {
            names.push(file.to_string());
        }
    }
    Ok(names)
}

fn hub_error(repo: &HubRepo, file: &str, message: impl Into<String>) -> Error {
    Error::Hub {
        repo: repo.id.clone(),
        file: file.to_string(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_come_from_home() {
        let r = resolve(&HubOptions::default(), &env_of(&[("HOME", "/home/u")])).unwrap();
        assert_eq!(r.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(r.cache_dir, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert_eq!(r.token, None);
        assert!(!r.offline);
    }

    #[test]
    fn environment_overrides_defaults_and_options_override_environment() {
        let env = env_of(&[
            ("HOME", "/home/u"),
            ("HF_HOME", "/hf"),
            ("HF_ENDPOINT", "http://mirror.local/"),
            ("HF_TOKEN", "hf_env"),
            ("HF_HUB_OFFLINE", "1"),
        ]);
        let r = resolve(&HubOptions::default(), &env).unwrap();
        assert_eq!(r.endpoint, "http://mirror.local");
        assert_eq!(r.cache_dir, PathBuf::from("/hf/hub"));
        assert_eq!(r.token.as_deref(), Some("hf_env"));
        assert!(r.offline);

        let env = env_of(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/cache")]);
        assert_eq!(
            resolve(&HubOptions::default(), &env).unwrap().cache_dir,
            PathBuf::from("/cache")
        );

        let options = HubOptions::default()
            .with_endpoint("https://example.org")
            .with_cache_dir("/mine")
            .with_token("hf_opt")
            .with_offline(false);
        let r = resolve(
            &options,
            &env_of(&[
                ("HF_ENDPOINT", "http://x"),
                ("HF_TOKEN", "t"),
                ("HF_HUB_OFFLINE", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(r.endpoint, "https://example.org");
        assert_eq!(r.cache_dir, PathBuf::from("/mine"));
        assert_eq!(r.token.as_deref(), Some("hf_opt"));
        assert!(!r.offline);
    }

    #[test]
    fn xdg_cache_and_token_file() {
        let dir = tempfile::tempdir().unwrap();
        let xdg = dir.path().to_str().unwrap().to_string();
        std::fs::create_dir_all(dir.path().join("huggingface")).unwrap();
        std::fs::write(dir.path().join("huggingface/token"), "hf_file\n").unwrap();
        let r = resolve(
            &HubOptions::default(),
            &env_of(&[("XDG_CACHE_HOME", &xdg), ("HF_ENDPOINT", "")]),
        )
        .unwrap();
        assert_eq!(r.cache_dir, dir.path().join("huggingface/hub"));
        assert_eq!(r.token.as_deref(), Some("hf_file"));
        assert_eq!(
            r.endpoint, DEFAULT_ENDPOINT,
            "empty variables count as unset"
        );
    }

    #[test]
    fn bad_settings_are_config_errors() {
        let err = resolve(&HubOptions::default(), &env_of(&[])).unwrap_err();
        assert!(matches!(err, Error::Config { ref field, .. } if field == "cache_dir"));
        let err = resolve(
            &HubOptions::default().with_endpoint("huggingface.co"),
            &env_of(&[("HOME", "/h")]),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Config { ref field, .. } if field == "endpoint"));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let options = HubOptions::default()
            .with_token("hf_secret")
            .with_cache_dir("/c");
        assert!(!format!("{options:?}").contains("hf_secret"));
        let hub = Hub::new(&options).unwrap();
        assert!(!format!("{hub:?}").contains("hf_secret"));
    }
}
