//! Loading a [`LocalBackend`] straight from the Hugging Face hub (feature `hub`).

use std::path::{Path, PathBuf};

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

/// Downloads the files [`LocalBackend::from_dir`] reads; returns the snapshot directory that
/// holds them all.
async fn download_model(hub: &Hub, repo: &HubRepo) -> Result<PathBuf> {
    let config = hub.get(repo, "config.json").await?;
    let dir = config
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| hub_error(repo, "config.json", "the cached file has no directory"))?;
    let mut files = vec![(
        "tokenizer.json".to_string(),
        hub.get(repo, "tokenizer.json").await?,
    )];
    if let Some(p) = hub.get_optional(repo, "tokenizer_config.json").await? {
        files.push(("tokenizer_config.json".to_string(), p));
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
