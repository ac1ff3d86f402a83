//! Loading a [`LocalBackend`] straight from the Hugging Face hub (feature `hub`).

use std::path::PathBuf;

use super::{LocalBackend, LocalOptions};
use crate::error::{Error, Result};
use crate::hub::{Hub, HubOptions, HubRepo};

impl LocalBackend {
    /// Downloads the Hugging Face model repository `repo` (e.g. `"Qwen/Qwen3-0.6B"`) into the
    /// hub cache, or reuses the cached files, and loads it as [`from_dir`](Self::from_dir)
    /// does. Settings (endpoint, cache, token, offline mode) come from the environment
    /// ([`HubOptions::default`]).
    ///
    /// Files fetched: `config.json`, `tokenizer.json`, `tokenizer_config.json` (optional), and
    /// the weights: `model.safetensors`, or else `model.safetensors.index.json` and every
    /// shard it names.
    ///
    /// ```no_run
    /// # async fn demo() -> rlvr::Result<()> {
    /// use rlvr::backend::local::{LocalBackend, LocalOptions};
    /// let backend = LocalBackend::from_pretrained("Qwen/Qwen3-0.6B", LocalOptions::default()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: [`Error::Hub`] naming the repository and file that could not be downloaded;
    /// then the errors of [`from_dir`](Self::from_dir).
    pub async fn from_pretrained(repo: &str, opts: LocalOptions) -> Result<Self> {
        let hub = Hub::new(&HubOptions::default())?;
        Self::from_pretrained_with(&hub, &HubRepo::model(repo), opts).await
    }

    /// [`from_pretrained`](Self::from_pretrained) through a configured [`Hub`], at the
    /// repository's revision.
    pub async fn from_pretrained_with(
        hub: &Hub,
        repo: &HubRepo,
        opts: LocalOptions,
    ) -> Result<Self> {
        let dir = download_model(hub, repo).await?;
        // Reading (and copying) the weights is blocking work.
        tokio::task::spawn_blocking(move || LocalBackend::from_dir(dir, opts))
            .await
            .map_err(|e| Error::Backend(format!("loading the model: {e}")))?
    }
}

/// Downloads the files [`LocalBackend::from_dir`] reads ([`Hub::model_snapshot`], which
/// `tokenizer.json` must be part of); returns the snapshot directory that holds them all.
async fn download_model(hub: &Hub, repo: &HubRepo) -> Result<PathBuf> {
    let dir = hub.model_snapshot(repo).await?;
    if !dir.join("tokenizer.json").is_file() {
        // A clear error naming the file (the hub's own, when it is missing there).
        hub.get(repo, "tokenizer.json").await?;
    }
    Ok(dir)
}
