//! The service client: bootstrap (client config, JWT, dynamic config), session, heartbeat,
//! training-client creation, close.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::config::{TinkerConfig, SDK_VERSION};
use super::futures::{retrieve, FutureSpec, Promise, RequestType};
use super::http::{decode_json, Body, Call, Http};
use super::sampling::TinkerSampler;
use super::training::{GetInfoResponse, TinkerBackend, TinkerBackendOptions};
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

/// A model the server can train or sample (`get_server_capabilities`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct SupportedModel {
    /// Model name, e.g. `Qwen/Qwen3-8B`.
    #[serde(default)]
    pub model_name: Option<String>,
    /// Longest context, in tokens.
    #[serde(default)]
    pub max_context_length: Option<u64>,
    /// Whether LoRA training is offered.
    #[serde(default)]
    pub trainable: Option<bool>,
    /// Whether sampling is offered.
    #[serde(default)]
    pub sampleable: Option<bool>,
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

/// A connection to a Tinker service: one session with its heartbeat. Create training
/// backends from it with [`create_lora_training`](Self::create_lora_training); call
/// [`close`](Self::close) at the end (dropping the last handle finishes the session on a
/// best-effort basis).
///
/// ```no_run
/// # async fn run() -> rlvr::Result<()> {
/// use rlvr::backend::tinker::{TinkerClient, TinkerConfig};
/// use rlvr::LoraConfig;
/// let client = TinkerClient::connect(TinkerConfig::from_env()?).await?;
/// let backend = client.create_lora_training("Qwen/Qwen3-8B", LoraConfig::new(32)).await?;
/// // ... train with `backend` ...
/// client.close().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TinkerClient {
    pub(crate) session: Arc<Session>,
}

impl std::fmt::Debug for TinkerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerClient")
            .field("session_id", &self.session.session_id)
            .finish_non_exhaustive()
    }
}

/// client/config → (auth/token) → client/dynamic_config, as a holder does on creation.
async fn bootstrap(http: &Http) -> Result<ServerConfig> {
    let body = serde_json::json!({"sdk_version": SDK_VERSION});
    let server: ServerConfig = http
        .with_holder_retries(|| {
            let call = Call::post_json(http, "client/config", &body).map(|mut c| {
                c.raw_key = true;
                c
            });
            async move {
                let resp = http.send(call?).await?;
                decode_json::<ServerConfig>(&resp.body, "client/config response")
            }
        })
        .await?;
    if server.pjwt_auth_enabled {
        http.enable_jwt().await?;
    }
    let dynamic = http
        .with_holder_retries(|| {
            let call = Call::post_json(http, "client/dynamic_config", &body)
                .map(|c| c.retries(0).timeout(Duration::from_secs(10)));
            async move {
                match http.send(call?).await {
                    Ok(_) => Ok(()),
                    // Servers without dynamic config: use the defaults.
                    Err(Error::Http { status: 404, .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .await;
    dynamic?;
    Ok(server)
}

impl TinkerClient {
    /// Connects: fetches the client config (and a JWT when the server asks for it), creates
    /// a session and starts its heartbeat.
    pub async fn connect(config: TinkerConfig) -> Result<TinkerClient> {
        let http = Arc::new(Http::new(&config)?);
        let server = bootstrap(&http).await?;

        #[derive(Serialize)]
        struct CreateSession<'a> {
            tags: &'a [String],
            user_metadata: serde_json::Map<String, serde_json::Value>,
            sdk_version: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            project_id: Option<&'a str>,
            #[serde(rename = "type")]
            kind: &'static str,
        }
        #[derive(Deserialize)]
        struct CreateSessionResponse {
            session_id: String,
            #[serde(default)]
            info_message: Option<String>,
            #[serde(default)]
            warning_message: Option<String>,
            #[serde(default)]
            error_message: Option<String>,
        }
        let req = CreateSession {
            tags: &config.tags,
            user_metadata: serde_json::Map::new(),
            sdk_version: SDK_VERSION,
            project_id: config.project_id.as_deref(),
            kind: "create_session",
        };
        let resp = http
            .send(Call::post_json(&http, "create_session", &req)?)
            .await?;
        let r: CreateSessionResponse = decode_json(&resp.body, "create_session response")?;
        if let Some(m) = &r.info_message {
            tracing::info!("tinker: {m}");
        }
        if let Some(m) = &r.warning_message {
            tracing::warn!("tinker: {m}");
        }
        if let Some(m) = &r.error_message {
            tracing::error!("tinker: {m}");
        }

        let jwt = server.pjwt_auth_enabled;
        let slots = server
            .sample_max_concurrent_requests
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        let session = Arc::new(Session {
            http: Arc::clone(&http),
            session_id: r.session_id.clone(),
            server,
            model_seq: AtomicU32::new(0),
            sampling_seq: AtomicU32::new(0),
            tasks: Mutex::new(Vec::new()),
            sample_slots: tokio::sync::Semaphore::new(slots),
            closed: AtomicBool::new(false),
            sample_backoff: Mutex::new(None),
            submit_slots: tokio::sync::Semaphore::new(400),
            throttle_slots: tokio::sync::Semaphore::new(10),
        });
        let mut tasks = vec![tokio::spawn(heartbeat_loop(
            Arc::clone(&http),
            r.session_id,
            config.heartbeat_interval,
        ))];
        if jwt {
            tasks.push(tokio::spawn(http.jwt_refresh_loop()));
        }
        if let Ok(mut g) = session.tasks.lock() {
            *g = tasks;
        }
        Ok(TinkerClient { session })
    }

    /// The server-assigned session id.
    pub fn session_id(&self) -> &str {
        &self.session.session_id
    }

    /// Creates a LoRA training run on `base_model` (tokenizer resolved from the model name,
    /// see [`TinkerBackendOptions`]).
    pub async fn create_lora_training(
        &self,
        base_model: &str,
        lora: LoraConfig,
    ) -> Result<TinkerBackend> {
        self.create_lora_training_with(base_model, lora, TinkerBackendOptions::default())
            .await
    }

    /// Like [`create_lora_training`](Self::create_lora_training), with options (e.g. an
    /// explicit tokenizer).
    pub async fn create_lora_training_with(
        &self,
        base_model: &str,
        lora: LoraConfig,
        options: TinkerBackendOptions,
    ) -> Result<TinkerBackend> {
        if !(lora.train_attn || lora.train_mlp || lora.train_unembed) {
            return Err(Error::config(
                "lora_config",
                "at least one of train_attn, train_mlp, train_unembed must be true",
            ));
        }
        let session = &self.session;
        let sdk = "ServiceClient.create_lora_training_client";
        let model_id = create_model(session, base_model, &lora, sdk).await?;
        let info = get_info(session, &model_id, sdk).await?;
        TinkerBackend::new(
            Arc::clone(session),
            model_id,
            base_model.to_string(),
            lora,
            info,
            options,
        )
        .await
    }

    /// A sampler over the untrained base model (`create_sampling_session`).
    pub async fn base_model_sampler(&self, base_model: &str) -> Result<TinkerSampler> {
        let id = self
            .session
            .create_sampling_session(
                Some(base_model),
                None,
                "ServiceClient.create_sampling_client",
            )
            .await?;
        Ok(TinkerSampler::new(Arc::clone(&self.session), id))
    }

    /// The models a server offers (`GET get_server_capabilities`), through a separate
    /// session-less client as the SDK does.
    pub async fn get_server_capabilities(config: &TinkerConfig) -> Result<Vec<SupportedModel>> {
        #[derive(Deserialize)]
        struct Caps {
            #[serde(default)]
            supported_models: Vec<SupportedModel>,
        }
        let http = Http::new(config)?;
        bootstrap(&http).await?;
        let caps: Caps = http
            .with_holder_retries(|| {
                let call = Call {
                    method: Method::GET,
                    path: "get_server_capabilities".into(),
                    body: Body::None,
                    accept: "application/json",
                    max_retries: http.max_retries,
                    timeout: http.timeout,
                    headers: Vec::new(),
                    sdk_method: Some("ServiceClient.get_server_capabilities"),
                    raw_key: false,
                };
                let http = &http;
                async move {
                    let resp = http.send(call).await?;
                    decode_json::<Caps>(&resp.body, "get_server_capabilities response")
                }
            })
            .await?;
        Ok(caps.supported_models)
    }

    /// Finishes the session (`sessions/{id}/finish` with reason `success`) and stops the
    /// heartbeat. Backends created from this client stop working afterwards.
    pub async fn close(&self) -> Result<()> {
        self.session.stop_heartbeat();
        if self.session.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.session.finish("success").await
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
            raw: body.clone(),
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

/// Sends a heartbeat every `interval` until the task is aborted or the server answers 410.
async fn heartbeat_loop(http: Arc<Http>, session_id: String, interval: Duration) {
    let body = serde_json::json!({"session_id": session_id, "type": "session_heartbeat"});
    let mut last_ok = Instant::now();
    let mut warned = false;
    loop {
        tokio::time::sleep(interval).await;
        let call = match Call::post_json(&http, "session_heartbeat", &body) {
            Ok(c) => c.retries(0).timeout(Duration::from_secs(10)),
            Err(_) => return,
        };
        match http.send(call).await {
            Ok(_) => {
                last_ok = Instant::now();
                warned = false;
            }
            Err(Error::Http { status: 410, .. }) => {
                tracing::info!("tinker session {session_id} has finished (410); heartbeat stops");
                return;
            }
            Err(e) => {
                if last_ok.elapsed() > Duration::from_secs(120) && !warned {
                    tracing::warn!("tinker heartbeat failing for over 120 s: {e}");
                    warned = true;
                } else {
                    tracing::debug!("tinker heartbeat failed: {e}");
                }
            }
        }
    }
}
