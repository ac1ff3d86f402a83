//! The session: state shared by a client and everything created from it (HTTP, ids,
//! sequence counters, sampling slots), and the session-level calls that both the client and
//! a training run make (`create_sampling_session`, `create_model`, `get_info`, `finish`).
//!
//! Layers: `session` ← `sampling` ← `training` ← `client`; nothing here imports upward.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::futures::{FutureSpec, Promise, RequestType, retrieve};
use super::http::{Call, Http, decode_json};
use crate::error::{Error, Result};
use crate::types::LoraConfig;

/// Server feature flags from `/api/v1/client/config` (the SDK's defaults when absent).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct ServerConfig {
    pub pjwt_auth_enabled: bool,
    pub parallel_fwdbwd_chunks: bool,
    pub proto_compress_fwdbwd: bool,
    pub fwdbwd_max_chunk_len: usize,
    pub fwdbwd_max_chunk_bytes_count: usize,
    pub sample_no_retries: bool,
    pub sample_enable_stuck_detection: bool,
    pub sample_max_concurrent_requests: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            pjwt_auth_enabled: false,
            parallel_fwdbwd_chunks: true,
            proto_compress_fwdbwd: false,
            fwdbwd_max_chunk_len: 1024,
            fwdbwd_max_chunk_bytes_count: 5_000_000,
            sample_no_retries: false,
            sample_enable_stuck_detection: true,
            sample_max_concurrent_requests: 2000,
        }
    }
}

/// `model_data` of a `get_info` response.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct ModelData {
    /// Architecture, e.g. `qwen3`.
    #[serde(default)]
    pub arch: Option<String>,
    /// Base model name.
    #[serde(default)]
    pub model_name: Option<String>,
    /// Tokenizer repository (the part before any `:` is used).
    #[serde(default)]
    pub tokenizer_id: Option<String>,
}

/// The `get_info` response of a training run.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GetInfoResponse {
    /// The model id.
    #[serde(default)]
    pub model_id: Option<String>,
    /// Model data.
    #[serde(default)]
    pub model_data: ModelData,
    /// Whether the run is a LoRA.
    #[serde(default)]
    pub is_lora: Option<bool>,
    /// LoRA rank.
    #[serde(default)]
    pub lora_rank: Option<u32>,
    /// Base model name.
    #[serde(default)]
    pub model_name: Option<String>,
}

/// State shared by a client and everything created from it.
pub(crate) struct Session {
    pub http: Arc<Http>,
    pub session_id: String,
    pub server: ServerConfig,
    model_seq: AtomicU32,
    sampling_seq: AtomicU32,
    /// Background tasks (heartbeat, JWT refresh), aborted on close.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Cap on samples in flight (`sample_max_concurrent_requests`).
    pub sample_slots: tokio::sync::Semaphore,
    closed: AtomicBool,
    /// Global sampling back-off deadline set by a 429 on `asample`.
    pub sample_backoff: Mutex<Option<Instant>>,
    /// Cap on concurrent `asample` submissions (400, as the SDK).
    pub submit_slots: tokio::sync::Semaphore,
    /// After a back-off, submissions are throttled to 10 at a time for 10 s.
    pub throttle_slots: tokio::sync::Semaphore,
}

impl Session {
    /// A fresh session: counters at 0, no background tasks yet.
    pub fn new(http: Arc<Http>, session_id: String, server: ServerConfig) -> Self {
        let slots = server
            .sample_max_concurrent_requests
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Session {
            http,
            session_id,
            server,
            model_seq: AtomicU32::new(0),
            sampling_seq: AtomicU32::new(0),
            tasks: Mutex::new(Vec::new()),
            sample_slots: tokio::sync::Semaphore::new(slots),
            closed: AtomicBool::new(false),
            sample_backoff: Mutex::new(None),
            submit_slots: tokio::sync::Semaphore::new(400),
            throttle_slots: tokio::sync::Semaphore::new(10),
        }
    }

    /// Hands the session its background tasks (heartbeat, JWT refresh), aborted on close.
    pub fn set_tasks(&self, tasks: Vec<tokio::task::JoinHandle<()>>) {
        if let Ok(mut g) = self.tasks.lock() {
            *g = tasks;
        }
    }

    /// Stops the background tasks and finishes the session once (reason `success`).
    pub async fn close(&self) -> Result<()> {
        self.close_with("success").await
    }

    /// Like [`close`](Self::close), with the finish reason (`success` or `errored`).
    pub async fn close_with(&self, reason: &str) -> Result<()> {
        self.stop_heartbeat();
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.finish(reason).await
    }

    pub fn next_model_seq(&self) -> u32 {
        self.model_seq.fetch_add(1, Ordering::SeqCst)
    }
    pub fn next_sampling_seq(&self) -> u32 {
        self.sampling_seq.fetch_add(1, Ordering::SeqCst)
    }

    /// `create_sampling_session` (synchronous; 10 HTTP retries, no holder loop).
    pub async fn create_sampling_session(
        self: &Arc<Self>,
        base_model: Option<&str>,
        model_path: Option<&str>,
        sdk_method: &'static str,
    ) -> Result<String> {
        #[derive(Serialize)]
        struct Req<'a> {
            session_id: &'a str,
            sampling_session_seq_id: u32,
            #[serde(skip_serializing_if = "Option::is_none")]
            base_model: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            model_path: Option<&'a str>,
            #[serde(rename = "type")]
            kind: &'static str,
        }
        #[derive(Deserialize)]
        struct Resp {
            sampling_session_id: String,
        }
        let req = Req {
            session_id: &self.session_id,
            sampling_session_seq_id: self.next_sampling_seq(),
            base_model,
            model_path,
            kind: "create_sampling_session",
        };
        let call = Call::post_json(&self.http, "create_sampling_session", &req)?.sdk(sdk_method);
        let resp = self.http.send(call).await?;
        let r: Resp = decode_json(&resp.body, "create_sampling_session response")?;
        Ok(r.sampling_session_id)
    }

    async fn finish(&self, reason: &str) -> Result<()> {
        let body = serde_json::json!({"reason": {"type": reason}, "detail": null});
        let path = format!("sessions/{}/finish", self.session_id);
        let r = self
            .http
            .with_holder_retries(|| {
                let call = Call::post_json(&self.http, path.clone(), &body)
                    .map(|c| c.sdk("ServiceClient.close"));
                async move { self.http.send(call?).await }
            })
            .await;
        match r {
            Ok(_) => Ok(()),
            // No finish endpoint (some compatible servers) or already finished: the session
            // ends by missed heartbeats, nothing else to do.
            Err(Error::Http {
                status: 404 | 410, ..
            }) => {
                tracing::debug!("session finish not supported by the server; heartbeat stopped");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn stop_heartbeat(&self) {
        if let Ok(mut g) = self.tasks.lock() {
            for h in g.drain(..) {
                h.abort();
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop_heartbeat();
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Best effort: tell the server the session is over (it would otherwise end by
        // missed heartbeats).
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let http = Arc::clone(&self.http);
            let path = format!("sessions/{}/finish", self.session_id);
            handle.spawn(async move {
                let body = serde_json::json!({"reason": {"type": "success"}, "detail": null});
                if let Ok(call) = Call::post_json(&http, path, &body) {
                    let call = call
                        .sdk("ServiceClient.close")
                        .retries(0)
                        .timeout(Duration::from_secs(5));
                    if let Err(e) = http.send(call).await {
                        tracing::debug!("finishing the session on drop failed: {e}");
                    }
                }
            });
        }
    }
}

/// `create_model` (10 HTTP retries, no holder loop) and its future: a new LoRA training run.
pub(crate) async fn create_model(
    session: &Arc<Session>,
    base_model: &str,
    lora: &LoraConfig,
    sdk: &'static str,
) -> Result<String> {
    let http = &session.http;

    #[derive(Serialize)]
    struct Lora {
        rank: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        seed: Option<u64>,
        train_unembed: bool,
        train_mlp: bool,
        train_attn: bool,
    }
    #[derive(Serialize)]
    struct CreateModel<'a> {
        session_id: &'a str,
        model_seq_id: u32,
        base_model: &'a str,
        lora_config: Lora,
        optimizer_config: serde_json::Value,
        #[serde(rename = "type")]
        kind: &'static str,
    }
    #[derive(Deserialize)]
    struct CreateModelResult {
        #[serde(default)]
        model_id: Option<String>,
    }
    let model_seq_id = session.next_model_seq();
    let req = CreateModel {
        session_id: &session.session_id,
        model_seq_id,
        base_model,
        lora_config: Lora {
            rank: lora.rank,
            seed: lora.seed,
            train_unembed: lora.train_unembed,
            train_mlp: lora.train_mlp,
            train_attn: lora.train_attn,
        },
        optimizer_config: serde_json::json!({"type": "adamw"}),
        kind: "create_model",
    };
    let t0 = Instant::now();
    let resp = http
        .send(Call::post_json(http, "create_model", &req)?.sdk(sdk))
        .await?;
    let promise: Promise = decode_json(&resp.body, "create_model promise")?;
    let spec = FutureSpec {
        request_id: promise.request_id.clone(),
        request_type: RequestType::CreateModel,
        roundtrip: t0.elapsed(),
        sdk_method: sdk,
        label: format!("create_model ({base_model})"),
    };
    let body = retrieve(http, &spec).await?;
    let result: CreateModelResult = decode_json(&body, "create_model result")?;
    let model_id = result
        .model_id
        .or(promise.model_id)
        .ok_or_else(|| Error::Decode {
            what: "create_model result".into(),
            message: "no model_id".into(),
            raw: body.to_vec(),
        })?;
    Ok(model_id)
}

/// `get_info` (synchronous JSON, holder loop).
pub(crate) async fn get_info(
    session: &Arc<Session>,
    model_id: &str,
    sdk: &'static str,
) -> Result<GetInfoResponse> {
    let http = &session.http;
    let body = serde_json::json!({"model_id": model_id, "type": "get_info"});
    http.with_holder_retries(|| {
        let call = Call::post_json(http, "get_info", &body).map(|c| c.sdk(sdk));
        async move {
            let resp = http.send(call?).await?;
            decode_json::<GetInfoResponse>(&resp.body, "get_info response")
        }
    })
    .await
}

/// A new training run created by loading `path` as its first request (the SDK 0.38
/// create-via-load form, weights only: `optimizer: false`), then its `get_info`. Returns the
/// run's model id and info.
pub(crate) async fn load_into_new_run(
    session: &Arc<Session>,
    path: &str,
    user_metadata: Option<&serde_json::Value>,
    sdk: &'static str,
) -> Result<(String, GetInfoResponse)> {
    let http = &session.http;
    let model_seq_id = session.next_model_seq();
    let mut body = serde_json::Map::new();
    body.insert("session_id".into(), session.session_id.clone().into());
    body.insert("model_seq_id".into(), model_seq_id.into());
    if let Some(m) = user_metadata {
        body.insert("user_metadata".into(), m.clone());
    }
    body.insert("path".into(), path.into());
    body.insert("optimizer".into(), false.into());
    body.insert("type".into(), "load_weights".into());
    let body = serde_json::Value::Object(body);
    let t0 = Instant::now();
    let promise = http
        .with_holder_retries(|| {
            let call = Call::post_json(http, "load_weights", &body).map(|c| c.sdk(sdk));
            async move {
                let resp = http.send(call?).await?;
                decode_json::<Promise>(&resp.body, "load_weights promise")
            }
        })
        .await?;
    #[derive(serde::Deserialize)]
    struct LoadResult {
        #[serde(default)]
        model_id: Option<String>,
    }
    let promised = promise.model_id.clone();
    let spec = FutureSpec {
        request_id: promise.request_id,
        request_type: RequestType::LoadWeights,
        roundtrip: t0.elapsed(),
        sdk_method: sdk,
        label: format!("load_weights ({path})"),
    };
    let result = retrieve(http, &spec).await?;
    let r: LoadResult = decode_json(&result, "load_weights result")?;
    let model_id = r
        .model_id
        .or(promised)
        .unwrap_or_else(|| format!("{}:train:{model_seq_id}", session.session_id));
    let info = get_info(session, &model_id, sdk).await?;
    Ok((model_id, info))
}
