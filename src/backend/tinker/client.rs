//! The service client: bootstrap (client config, JWT, dynamic config), session creation,
//! heartbeat, training-client creation, close. The top layer: it builds on `session`,
//! `sampling` and `training`, and none of them imports it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::config::{SDK_VERSION, TinkerConfig};
use super::http::{Body, Call, Http, decode_json};
use super::sampling::TinkerSampler;
use super::session::{ServerConfig, Session, create_model, get_info, load_into_new_run};
use super::training::{TinkerBackend, TinkerBackendOptions};
use crate::error::{Error, Result};
use crate::types::LoraConfig;

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

/// A connection to a Tinker service: one session with its heartbeat. Create training
/// backends from it with [`create_lora_training`](Self::create_lora_training); call
/// [`close`](Self::close) at the end (dropping the last handle finishes the session on a
/// best-effort basis).
///
/// ```no_run
/// # async fn run() -> rlvr::Result<()> {
/// use rlvr::backend::tinker::{TinkerClient, TinkerConfig};
/// use rlvr::types::LoraConfig;
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
pub(crate) async fn bootstrap(http: &Http) -> Result<ServerConfig> {
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
        Self::open_session(http, server, &config).await
    }

    /// Creates a session on a client that has fetched its config already (a REST client's,
    /// as the SDK's service and REST clients share one holder).
    pub(crate) async fn open_session(
        http: Arc<Http>,
        server: ServerConfig,
        config: &TinkerConfig,
    ) -> Result<TinkerClient> {
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
        let session = Arc::new(Session::new(
            Arc::clone(&http),
            r.session_id.clone(),
            server,
        ));
        let mut tasks = vec![tokio::spawn(heartbeat_loop(
            Arc::clone(&http),
            r.session_id,
            config.heartbeat_interval,
        ))];
        if jwt {
            tasks.push(tokio::spawn(http.jwt_refresh_loop()));
        }
        session.set_tasks(tasks);
        Ok(TinkerClient { session })
    }

    /// Creates a training run from a checkpoint saved with `save_state`
    /// (`tinker://<run>/weights/<name>`): its weights only, a fresh optimizer, as the SDK's
    /// `ServiceClient.create_training_client_from_state`. The run's base model and LoRA rank
    /// are the checkpoint's (from `get_info`; rank 32 where it gives none, which only matters
    /// to [`load_state`](crate::PolicyBackend::load_state) on servers that answer its
    /// one-request form with 422); the tokenizer is resolved as in
    /// [`create_lora_training_with`](Self::create_lora_training_with).
    ///
    /// ```no_run
    /// # async fn run(client: rlvr::backend::tinker::TinkerClient) -> rlvr::Result<()> {
    /// use rlvr::backend::tinker::TinkerBackendOptions;
    /// let backend = client
    ///     .create_training_from_state("tinker://run-1:train:0/weights/step-100", TinkerBackendOptions::default())
    ///     .await?;
    /// println!("training {} again", backend.base_model());
    /// # Ok(()) }
    /// ```
    pub async fn create_training_from_state(
        &self,
        tinker_path: &str,
        options: TinkerBackendOptions,
    ) -> Result<TinkerBackend> {
        let sdk = "ServiceClient.create_training_client_from_state";
        let (model_id, info) = load_into_new_run(&self.session, tinker_path, None, sdk).await?;
        let base_model = info
            .model_data
            .model_name
            .clone()
            .or_else(|| info.model_name.clone())
            .ok_or_else(|| Error::Decode {
                what: "get_info response".into(),
                message: format!("no model name for the run loaded from {tinker_path}"),
                raw: Vec::new(),
            })?;
        let lora = LoraConfig::new(info.lora_rank.unwrap_or(32));
        TinkerBackend::new(
            Arc::clone(&self.session),
            model_id,
            base_model,
            lora,
            info,
            options,
        )
        .await
    }

    /// Finishes the session with `reason` (`success` or `errored`).
    pub(crate) async fn close_with(&self, reason: &str) -> Result<()> {
        self.session.close_with(reason).await
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
        self.session.close().await
    }
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
