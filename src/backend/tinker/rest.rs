//! The REST side of the service (the SDK's `RestClient`): checkpoint paths, signed download
//! URLs of an external-weights export, a checkpoint's TTL, deleting a checkpoint. No
//! session: a REST client only fetches the client config (as the SDK's holder does).

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use reqwest::Method;
use serde::Deserialize;

use super::client::bootstrap;
use super::config::TinkerConfig;
use super::http::{Body, Call, Http, decode_json};
use super::session::ServerConfig;
use crate::error::{Error, Result};

/// The kind of checkpoint a `tinker://` path names (its middle segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointKind {
    /// `weights`: a full training state, from `save_state` (loadable into a training run).
    Training,
    /// `sampler_weights`: a sampler checkpoint (cannot be downloaded).
    Sampler,
    /// `external_weights`: an exportable copy, from `save_weights_external`.
    External,
}

impl CheckpointKind {
    /// The path segment: `weights`, `sampler_weights` or `external_weights`.
    pub fn segment(self) -> &'static str {
        match self {
            CheckpointKind::Training => "weights",
            CheckpointKind::Sampler => "sampler_weights",
            CheckpointKind::External => "external_weights",
        }
    }
}

/// A parsed `tinker://<run_id>/<segment>/<name>` checkpoint path, as the SDK's
/// `ParsedCheckpointTinkerPath`: exactly three `/`-separated parts after `tinker://`, the
/// middle one `weights`, `sampler_weights` or `external_weights`.
///
/// ```
/// use rlvr::backend::tinker::{CheckpointKind, TinkerPath};
/// let p = TinkerPath::parse("tinker://s-1:train:0/external_weights/final").unwrap();
/// assert_eq!(p.run_id(), "s-1:train:0");
/// assert_eq!(p.kind(), CheckpointKind::External);
/// assert_eq!(p.checkpoint_id(), "external_weights/final");
/// assert_eq!(p.kind().segment(), "external_weights");
/// assert!(TinkerPath::parse("tinker://run/weights").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TinkerPath {
    path: String,
    run_id: String,
    kind: CheckpointKind,
    name: String,
}

impl TinkerPath {
    /// Parses `path`; an [`Error::WeightsDownload`] of kind
    /// [`InvalidPath`](crate::error::WeightsDownloadErrorKind::InvalidPath) when it is not a
    /// checkpoint path.
    pub fn parse(path: &str) -> Result<TinkerPath> {
        let invalid = || {
            crate::error::download_error(
                path,
                crate::error::WeightsDownloadErrorKind::InvalidPath,
                None,
                format!("invalid tinker path: {path:?}"),
            )
        };
        let rest = path.strip_prefix("tinker://").ok_or_else(invalid)?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [run_id, segment, name] = parts[..] else {
            return Err(invalid());
        };
        let kind = match segment {
            "weights" => CheckpointKind::Training,
            "sampler_weights" => CheckpointKind::Sampler,
            "external_weights" => CheckpointKind::External,
            _ => return Err(invalid()),
        };
        Ok(TinkerPath {
            path: path.to_string(),
            run_id: run_id.to_string(),
            kind,
            name: name.to_string(),
        })
    }

    /// The training run id (a model id, `<session>:train:<n>`).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The checkpoint kind.
    pub fn kind(&self) -> CheckpointKind {
        self.kind
    }

    /// The checkpoint's name (the last part).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The checkpoint id of REST paths: `<segment>/<name>`.
    pub fn checkpoint_id(&self) -> String {
        format!("{}/{}", self.kind.segment(), self.name)
    }

    /// The whole path, as given.
    pub fn as_str(&self) -> &str {
        &self.path
    }
}

impl fmt::Display for TinkerPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)
    }
}

/// Signed download URLs of an external-weights checkpoint
/// (`GET training_runs/{run}/checkpoints/external_weights/{name}/external_weights_urls`).
#[derive(Clone, PartialEq, Eq)]
pub struct ExternalWeightsUrls {
    /// One signed URL per file, keyed by the file's path relative to the checkpoint root.
    pub urls: std::collections::BTreeMap<String, String>,
    /// When the URLs expire (as the service said; `None` when it sent a time this client
    /// could not read).
    pub expires: Option<SystemTime>,
}

impl fmt::Debug for ExternalWeightsUrls {
    // The URLs carry signatures: show the file names only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalWeightsUrls")
            .field("files", &self.urls.keys().collect::<Vec<_>>())
            .field("expires", &self.expires)
            .finish()
    }
}

/// The REST client (the SDK's `RestClient`): checkpoint management without a session.
///
/// ```no_run
/// # async fn run() -> rlvr::Result<()> {
/// use rlvr::backend::tinker::{TinkerConfig, TinkerRestClient};
/// let rest = TinkerRestClient::connect(&TinkerConfig::from_env()?).await?;
/// let urls = rest.external_weights_urls("tinker://run-1:train:0/external_weights/final").await?;
/// for name in urls.urls.keys() {
///     println!("{name}");
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TinkerRestClient {
    pub(crate) http: Arc<Http>,
    pub(crate) server: ServerConfig,
}

impl TinkerRestClient {
    /// Connects: fetches the client config (and a JWT when the server asks for it), as the
    /// SDK's `RestClient` does. Opens no session.
    pub async fn connect(config: &TinkerConfig) -> Result<TinkerRestClient> {
        let http = Arc::new(Http::new(config)?);
        let server = bootstrap(&http).await?;
        Ok(TinkerRestClient { http, server })
    }

    /// The signed per-file URLs of an external-weights checkpoint
    /// (`tinker://<run>/external_weights/<name>`; other kinds are refused before any request).
    pub async fn external_weights_urls(&self, tinker_path: &str) -> Result<ExternalWeightsUrls> {
        let p = TinkerPath::parse(tinker_path)?;
        if p.kind != CheckpointKind::External {
            return Err(crate::error::download_error(
                tinker_path,
                crate::error::WeightsDownloadErrorKind::InvalidPath,
                None,
                format!(
                    "get_external_weights_urls only accepts external weights checkpoints \
                     (tinker://<training_run_id>/external_weights/<name>), got {tinker_path:?}"
                ),
            ));
        }
        #[derive(Deserialize)]
        struct Resp {
            urls: std::collections::BTreeMap<String, String>,
            expires: String,
        }
        let path = format!(
            "training_runs/{}/checkpoints/{}/external_weights_urls",
            p.run_id,
            p.checkpoint_id()
        );
        let r: Resp = self
            .send(
                Method::GET,
                path,
                Body::None,
                "RestClient.get_external_weights_urls",
            )
            .await
            .and_then(|body| decode_json(&body, "external_weights_urls response"))?;
        Ok(ExternalWeightsUrls {
            urls: r.urls,
            expires: parse_rfc3339(&r.expires),
        })
    }

    /// Sets (`Some(seconds)`, 3600 s to 10 years) or removes (`None`) the expiry of a
    /// checkpoint (`PUT training_runs/{run}/checkpoints/{id}/ttl`).
    pub async fn set_checkpoint_ttl(
        &self,
        tinker_path: &str,
        ttl_seconds: Option<u64>,
    ) -> Result<()> {
        let p = TinkerPath::parse(tinker_path)?;
        let path = format!(
            "training_runs/{}/checkpoints/{}/ttl",
            p.run_id,
            p.checkpoint_id()
        );
        let body = serde_json::to_vec(&serde_json::json!({ "ttl_seconds": ttl_seconds }))
            .map_err(|e| Error::Backend(format!("serializing request: {e}")))?;
        self.send(
            Method::PUT,
            path,
            Body::Json(body.into()),
            "RestClient.set_checkpoint_ttl_from_tinker_path",
        )
        .await
        .map(drop)
    }

    /// Deletes a checkpoint (`DELETE training_runs/{run}/checkpoints/{id}`).
    pub async fn delete_checkpoint(&self, tinker_path: &str) -> Result<()> {
        let p = TinkerPath::parse(tinker_path)?;
        let path = format!(
            "training_runs/{}/checkpoints/{}",
            p.run_id,
            p.checkpoint_id()
        );
        // The SDK declares a JSON body on its DELETE (the content type, no bytes).
        self.send(
            Method::DELETE,
            path,
            Body::Json(bytes::Bytes::new()),
            "RestClient.delete_checkpoint_from_tinker_path",
        )
        .await
        .map(drop)
    }

    /// One REST call: the default HTTP retry budget under the holder loop.
    async fn send(
        &self,
        method: Method,
        path: String,
        body: Body,
        sdk: &'static str,
    ) -> Result<bytes::Bytes> {
        let http = &self.http;
        http.with_holder_retries(|| {
            let call = Call {
                method: method.clone(),
                path: path.clone(),
                body: body.clone(),
                accept: "application/json",
                max_retries: http.max_retries,
                timeout: http.timeout,
                headers: Vec::new(),
                sdk_method: Some(sdk),
                raw_key: false,
            };
            async move { http.send(call).await.map(|r| r.body) }
        })
        .await
    }
}

/// Parses an RFC 3339 time (`2026-12-05T13:00:00.123456Z`, `…+00:00`) into a `SystemTime`; a
/// time without a zone is UTC, as the service writes UTC.
pub(crate) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let utc = match chrono::DateTime::parse_from_rfc3339(s) {
        Ok(t) => t.with_timezone(&chrono::Utc),
        Err(_) => ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"]
            .iter()
            .find_map(|f| chrono::NaiveDateTime::parse_from_str(s, f).ok())?
            .and_utc(),
    };
    Some(SystemTime::from(utc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_times() {
        let t =
            |s: &str| parse_rfc3339(s).map(|t| t.duration_since(SystemTime::UNIX_EPOCH).unwrap());
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(Duration::ZERO));
        assert_eq!(
            t("2026-12-05T13:00:00.5Z"),
            Some(Duration::new(1_796_475_600, 500_000_000))
        );
        assert_eq!(t("2026-12-05T14:00:00+01:00"), t("2026-12-05T13:00:00Z"));
        assert_eq!(t("2026-12-05T12:30:00-00:30"), t("2026-12-05T13:00:00Z"));
        assert_eq!(t("garbage"), None);
        assert_eq!(t("2026-13-05T13:00:00Z"), None);
    }

    #[test]
    fn tinker_paths() {
        for bad in [
            "",
            "tinker://",
            "tinker://run/weights",
            "tinker://run/weights/a/b",
            "tinker://run/other/a",
            "http://run/weights/a",
        ] {
            assert!(TinkerPath::parse(bad).is_err(), "{bad}");
        }
        let p = TinkerPath::parse("tinker://r/sampler_weights/s").unwrap();
        assert_eq!(p.kind(), CheckpointKind::Sampler);
        assert_eq!(p.name(), "s");
        assert_eq!(p.to_string(), "tinker://r/sampler_weights/s");
    }
}
