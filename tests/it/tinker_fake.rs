//! Behaviour of the Tinker backend against a fake Tinker server that follows the protocol:
//! sessions, models with strict per-model `seq_id` ordering, futures that answer
//! `try_again` first, sampling sessions tied to weight versions, checkpoints — plus
//! injected faults (503, 429, 408, dropped connections, failed promises).

use crate::common::IdRenderer;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use prost::Message;
use rlvr::backend::tinker::proto;
use rlvr::backend::tinker::{TinkerBackend, TinkerBackendOptions, TinkerClient, TinkerConfig};
use rlvr::{
    Error, PolicyBackend, Sampler,
    types::{
        AdamParams, Datum, LoraConfig, LossFn, ModelInput, SamplingParams, StopReason, TensorData,
    },
};
use serde_json::{Value, json};

const KEY: &str = "tml-fake-key";
const EOS: u32 = 2;

/// A fault injected into the next request to an endpoint.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Answer with this status (and a `{"detail"}` body) without processing the request.
    Status(u16),
    /// Close the connection without answering.
    Drop,
    /// Reject the credential as an expired JWT (`401`, `WWW-Authenticate: … invalid_token`).
    InvalidToken,
}

#[derive(Debug, Clone)]
enum Outcome {
    Json(Value),
    Proto(Vec<u8>),
}

struct FutureState {
    try_again_left: u32,
    outcome: Outcome,
}

struct Model {
    base: String,
    /// The seq_id the next request must carry.
    expected_seq: i64,
    /// Incremented by every optim_step.
    version: u32,
    /// Gradients accumulated since the last optim_step.
    pending_grads: usize,
}

#[derive(Default)]
struct FakeOptions {
    chunk_len: usize,
    zstd: bool,
    /// Refuse the one-request `load_weights` with 422 (older servers).
    legacy_load_only: bool,
    /// Turn on JWT auth (`pjwt_auth_enabled`): requests other than client/config and
    /// auth/token must carry a token issued by auth/token.
    jwt: bool,
}

#[derive(Default)]
struct Fake {
    opts: FakeOptions,
    session: Option<String>,
    models: HashMap<String, Model>,
    model_count: u32,
    futures: HashMap<String, FutureState>,
    future_count: u32,
    sampling_sessions: HashMap<String, u32>,
    sampling_count: u32,
    checkpoints: HashMap<String, u32>,
    faults: VecDeque<(String, Fault)>,
    fail_next_forward_backward: bool,
    /// Arrival order of training requests and delivered results.
    events: Vec<String>,
    /// Every `forward_backward` request (forward-only ones too), in arrival order.
    fb_requests: Vec<proto::ForwardBackwardRequest>,
    heartbeats: usize,
    finished: bool,
    /// Sample `seq_id`s seen per sampling session.
    sample_seqs: Vec<(String, u64)>,
    /// JWTs handed out by auth/token.
    issued: Vec<String>,
}

type Shared = Arc<Mutex<Fake>>;

fn detail(status: u16, msg: impl Into<String>) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        json!({ "detail": msg.into() }).to_string(),
    )
        .into_response()
}

fn ok_json(v: Value) -> Response {
    ([("content-type", "application/json")], v.to_string()).into_response()
}

impl Fake {
    fn new_future(&mut self, outcome: Outcome) -> String {
        self.future_count += 1;
        let id = format!("req-{}", self.future_count);
        self.futures.insert(
            id.clone(),
            FutureState {
                try_again_left: 1,
                outcome,
            },
        );
        id
    }

    /// Checks and advances the model's seq_id.
    #[allow(clippy::result_large_err)]
    fn sequence(&mut self, model_id: &str, seq: i64) -> Result<&mut Model, Response> {
        let Some(m) = self.models.get_mut(model_id) else {
            return Err(detail(404, format!("unknown model {model_id}")));
        };
        if seq != m.expected_seq {
            return Err(detail(
                400,
                format!(
                    "out-of-order seq_id {seq} for {model_id}; expected {}",
                    m.expected_seq
                ),
            ));
        }
        m.expected_seq += 1;
        Ok(m)
    }

    fn promise(&mut self, outcome: Outcome, model_id: Option<&str>) -> Response {
        let id = self.new_future(outcome);
        let mut v = json!({ "request_id": id });
        if let Some(m) = model_id {
            v["model_id"] = json!(m);
        }
        ok_json(v)
    }

    fn forward_backward(&mut self, headers: &HeaderMap, body: &[u8]) -> Response {
        let raw = if headers.get("content-encoding").is_some_and(|v| v == "zstd") {
            match zstd::decode_all(body) {
                Ok(b) => b,
                Err(e) => return detail(400, format!("bad zstd: {e}")),
            }
        } else {
            body.to_vec()
        };
        let req = match proto::ForwardBackwardRequest::decode(raw.as_slice()) {
            Ok(r) => r,
            Err(e) => return detail(400, format!("bad protobuf: {e}")),
        };
        let seq = req.seq_id as i64;
        let n = req.data.len();
        if let Err(r) = self.sequence(&req.model_id, seq) {
            return r;
        }
        self.events.push(format!("forward_backward {seq}"));
        self.fb_requests.push(req.clone());
        if self.fail_next_forward_backward {
            self.fail_next_forward_backward = false;
            return self.promise(
                Outcome::Json(json!({"error": "injected: loss is NaN", "category": "user"})),
                Some(&req.model_id),
            );
        }
        if !req.forward_only
            && let Some(m) = self.models.get_mut(&req.model_id)
        {
            m.pending_grads += n;
        }
        let out = crate::common::fake_forward_backward_output(&req.data);
        let model = req.model_id.clone();
        self.promise(Outcome::Proto(out.encode_to_vec()), Some(&model))
    }

    fn handle_json(&mut self, path: &str, b: &Value) -> Response {
        let s = |k: &str| b[k].as_str().unwrap_or_default().to_string();
        match path {
            "client/config" => ok_json(json!({
                "pjwt_auth_enabled": self.opts.jwt,
                "proto_compress_fwdbwd": self.opts.zstd,
                "fwdbwd_max_chunk_len": self.opts.chunk_len.max(1),
                "parallel_fwdbwd_chunks": false,
            })),
            // Like servers without dynamic config.
            "client/dynamic_config" => detail(404, "Not Found"),
            "auth/token" => {
                use base64::Engine;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                let enc = |v: Value| {
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
                };
                let jwt = format!(
                    "{}.{}.sig{}",
                    enc(json!({"alg": "none"})),
                    enc(json!({"iat": now, "exp": now + 3600, "n": self.issued.len()})),
                    self.issued.len()
                );
                self.issued.push(jwt.clone());
                ok_json(json!({ "jwt": jwt }))
            }
            "create_session" => {
                self.session = Some("fake-session".into());
                ok_json(json!({"type": "create_session", "session_id": "fake-session"}))
            }
            "session_heartbeat" => {
                self.heartbeats += 1;
                ok_json(json!({"type": "session_heartbeat"}))
            }
            "create_model" => {
                let id = format!("fake-session:train:{}", b["model_seq_id"]);
                self.model_count += 1;
                self.models.insert(
                    id.clone(),
                    Model {
                        base: s("base_model"),
                        expected_seq: 1,
                        version: 0,
                        pending_grads: 0,
                    },
                );
                let r = json!({"model_id": id, "type": "create_model"});
                self.promise(Outcome::Json(r), Some(&id))
            }
            "get_info" => match self.models.get(&s("model_id")) {
                Some(m) => ok_json(json!({
                    "type": "get_info",
                    "model_id": s("model_id"),
                    "model_data": {"arch": "qwen3", "model_name": m.base},
                    "is_lora": true,
                })),
                None => detail(404, "unknown model"),
            },
            "optim_step" => {
                let model_id = s("model_id");
                let seq = b["seq_id"].as_i64().unwrap_or(-1);
                let lr = b["adam_params"]["learning_rate"]
                    .as_f64()
                    .unwrap_or(f64::NAN);
                let m = match self.sequence(&model_id, seq) {
                    Ok(m) => m,
                    Err(r) => return r,
                };
                m.version += 1;
                let grads = std::mem::take(&mut m.pending_grads);
                self.events.push(format!("optim_step {seq}"));
                let r = json!({"metrics": {"learning_rate:mean": lr, "grads:sum": grads}});
                self.promise(Outcome::Json(r), Some(&model_id))
            }
            "save_weights_for_sampler" => {
                let model_id = s("model_id");
                let seq = b["seq_id"].as_i64().unwrap_or(-1);
                let version = match self.sequence(&model_id, seq) {
                    Ok(m) => m.version,
                    Err(r) => return r,
                };
                self.events.push(format!("save_weights_for_sampler {seq}"));
                let id = format!("fake-session:sample:{}", b["sampling_session_seq_id"]);
                self.sampling_count += 1;
                self.sampling_sessions.insert(id.clone(), version);
                let r = json!({"path": format!("tinker://{model_id}/sampler_weights/s{version}"), "sampling_session_id": id});
                self.promise(Outcome::Json(r), Some(&model_id))
            }
            "create_sampling_session" => {
                let id = format!("fake-session:sample:{}", b["sampling_session_seq_id"]);
                self.sampling_sessions.insert(id.clone(), 0);
                ok_json(json!({"type": "create_sampling_session", "sampling_session_id": id}))
            }
            "asample" => {
                let sid = s("sampling_session_id");
                let Some(&version) = self.sampling_sessions.get(&sid) else {
                    return detail(404, format!("unknown sampling session {sid}"));
                };
                self.sample_seqs
                    .push((sid, b["seq_id"].as_u64().unwrap_or(u64::MAX)));
                let n = b["num_samples"].as_u64().unwrap_or(1) as usize;
                let prompt: Vec<i32> = b["prompt"]["chunks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|c| c["tokens"].as_array().cloned().unwrap_or_default())
                    .map(|t| t.as_i64().unwrap_or(0) as i32)
                    .collect();
                let max = b["sampling_params"]["max_tokens"].as_u64().unwrap_or(8) as usize;
                let sequences = (0..n)
                    .map(|i| {
                        // version*100 + i, then EOS (when it fits).
                        let mut toks = vec![(100 * version as i32) + i as i32 + 10];
                        let stop = if max >= 2 {
                            toks.push(EOS as i32);
                            proto::StopReason::Stop
                        } else {
                            proto::StopReason::Length
                        };
                        toks.truncate(max.max(1));
                        proto::SampledSequence {
                            stop_reason: stop as i32,
                            logprobs: Some(proto::f32_le(&vec![-0.25; toks.len()]).into()),
                            tokens: proto::i32_le(toks).into(),
                            topk_sampled_logprobs: None,
                        }
                    })
                    .collect();
                let prompt_logprobs = b["prompt_logprobs"].as_bool().unwrap_or(false).then(|| {
                    let lp: Vec<f32> = (0..prompt.len())
                        .map(|i| if i == 0 { f32::NAN } else { -(i as f32) })
                        .collect();
                    proto::f32_le(&lp)
                });
                let resp = proto::SampleResponse {
                    sequences,
                    prompt_logprobs,
                    ..Default::default()
                };
                // No sample_sequence_ids: they are optional for us.
                self.promise(Outcome::Proto(resp.encode_to_vec()), None)
            }
            "save_weights" => {
                let model_id = s("model_id");
                let seq = b["seq_id"].as_i64().unwrap_or(-1);
                let version = match self.sequence(&model_id, seq) {
                    Ok(m) => m.version,
                    Err(r) => return r,
                };
                let path = format!("tinker://{model_id}/weights/{}", s("path"));
                self.checkpoints.insert(path.clone(), version);
                self.events.push(format!("save_weights {seq}"));
                self.promise(
                    Outcome::Json(json!({"path": path, "type": "save_weights"})),
                    Some(&model_id),
                )
            }
            "load_weights" => {
                let path = s("path");
                let Some(&version) = self.checkpoints.get(&path) else {
                    return detail(400, format!("no checkpoint {path}"));
                };
                if b.get("session_id").is_some() {
                    if self.opts.legacy_load_only {
                        return detail(422, "model_id: field required");
                    }
                    let id = format!("fake-session:train:{}", b["model_seq_id"]);
                    let base = self
                        .models
                        .values()
                        .next()
                        .map(|m| m.base.clone())
                        .unwrap_or_default();
                    self.models.insert(
                        id.clone(),
                        Model {
                            base,
                            expected_seq: 1,
                            version,
                            pending_grads: 0,
                        },
                    );
                    self.events.push(format!("load_weights new {id}"));
                    let r = json!({"path": path, "model_id": id, "type": "load_weights"});
                    return self.promise(Outcome::Json(r), Some(&id));
                }
                let model_id = s("model_id");
                let seq = b["seq_id"].as_i64().unwrap_or(-1);
                // Like the peer: loading into a run is only allowed as its first request.
                if seq != 1 {
                    return detail(
                        400,
                        format!("LoadWeights is not permitted with seq_id {seq}"),
                    );
                }
                match self.sequence(&model_id, seq) {
                    Ok(m) => m.version = version,
                    Err(r) => return r,
                }
                self.events.push(format!("load_weights {seq}"));
                self.promise(
                    Outcome::Json(json!({"path": path, "type": "load_weights"})),
                    Some(&model_id),
                )
            }
            "retrieve_future" => {
                let id = s("request_id");
                let Some(f) = self.futures.get_mut(&id) else {
                    return detail(404, format!("unknown future {id}"));
                };
                if f.try_again_left > 0 {
                    f.try_again_left -= 1;
                    return ok_json(
                        json!({"type": "try_again", "request_id": id, "queue_state": "active"}),
                    );
                }
                let outcome = f.outcome.clone();
                self.events.push(format!("result {id}"));
                match outcome {
                    Outcome::Json(v) => ok_json(v),
                    Outcome::Proto(bytes) => {
                        ([("content-type", "application/x-protobuf")], bytes).into_response()
                    }
                }
            }
            p if p.starts_with("sessions/") && p.ends_with("/finish") => {
                self.finished = true;
                ok_json(json!({}))
            }
            other => detail(404, format!("no endpoint {other}")),
        }
    }
}

async fn handle(State(st): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().trim_start_matches("/api/v1/").to_string();
    let fault = {
        let mut st = st.lock().unwrap();
        let pos = st.faults.iter().position(|(p, _)| *p == path);
        pos.and_then(|i| st.faults.remove(i)).map(|(_, f)| f)
    };
    match fault {
        Some(Fault::Status(code)) => return detail(code, "injected"),
        Some(Fault::InvalidToken) => {
            return (
                StatusCode::UNAUTHORIZED,
                [("www-authenticate", r#"Bearer error="invalid_token""#)],
                "token expired",
            )
                .into_response();
        }
        // Unwinding the connection task closes the socket without an answer.
        Some(Fault::Drop) => std::panic::resume_unwind(Box::new("injected connection drop")),
        None => {}
    }
    let credential = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    {
        let st = st.lock().unwrap();
        let raw_key_path = path == "client/config" || path == "auth/token";
        let accepted = if st.opts.jwt && !raw_key_path {
            st.issued.contains(&credential)
        } else {
            credential == KEY
        };
        if !accepted {
            return detail(401, "bad credential");
        }
    }
    if headers.get("x-idempotency-key").is_none() {
        return detail(400, "missing X-Idempotency-Key");
    }
    let mut st = st.lock().unwrap();
    if path == "forward_backward" {
        return st.forward_backward(&headers, &body);
    }
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return detail(400, format!("bad JSON: {e}")),
    };
    st.handle_json(&path, &v)
}

async fn start(opts: FakeOptions) -> (TinkerConfig, Shared) {
    let st: Shared = Arc::new(Mutex::new(Fake {
        opts,
        ..Default::default()
    }));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(Arc::clone(&st));
    let addr = crate::common::serve(app).await;
    let config = TinkerConfig::new(KEY)
        .unwrap()
        .base_url(format!("http://{addr}"))
        .heartbeat_interval(Duration::from_millis(100));
    (config, st)
}

fn tokenizer() -> rlvr::tokenizer::Tokenizer {
    let inner = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
    rlvr::tokenizer::Tokenizer::new(inner, None, Some(EOS))
}

async fn backend(client: &TinkerClient) -> TinkerBackend {
    client
        .create_lora_training_with(
            "fake/tiny",
            LoraConfig::new(8),
            TinkerBackendOptions {
                tokenizer: Some(tokenizer()),
            },
        )
        .await
        .unwrap()
}

fn datum(prompt: &[u32], completion: &[u32], advantage: f32) -> Datum {
    let tokens: Vec<u32> = prompt.iter().chain(completion).copied().collect();
    let input = tokens[..tokens.len() - 1].to_vec();
    let n = input.len();
    let targets: Vec<i64> = tokens[1..].iter().map(|&t| t as i64).collect();
    let mask: Vec<f32> = (0..n)
        .map(|i| if i + 1 >= prompt.len() { 1.0 } else { 0.0 })
        .collect();
    Datum::new(ModelInput::from_tokens(input))
        .with_target_tokens(targets)
        .with_input(
            "logprobs",
            TensorData::f32(mask.iter().map(|m| -0.25 * m).collect()),
        )
        .with_input(
            "advantages",
            TensorData::f32(mask.iter().map(|m| advantage * m).collect()),
        )
}

#[tokio::test]
async fn training_loop_survives_injected_faults() {
    let (config, st) = start(FakeOptions {
        chunk_len: 1024,
        zstd: true,
        ..Default::default()
    })
    .await;
    {
        let mut s = st.lock().unwrap();
        for (p, f) in [
            ("get_info", Fault::Status(503)),
            ("forward_backward", Fault::Status(503)),
            ("optim_step", Fault::Drop),
            ("retrieve_future", Fault::Status(408)),
            ("retrieve_future", Fault::Status(503)),
            ("asample", Fault::Status(429)),
            ("asample", Fault::Drop),
            ("save_weights_for_sampler", Fault::Status(429)),
        ] {
            s.faults.push_back((p.to_string(), f));
        }
    }
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    let params = SamplingParams::default().max_tokens(4);
    let prompt = ModelInput::from_tokens(vec![5, 6, 7]);

    let mut sampler = backend.sampler().await.unwrap();
    for step in 0..3u32 {
        let seqs = sampler.sample(&prompt, 4, &params).await.unwrap();
        assert_eq!(seqs.len(), 4);
        for (i, s) in seqs.iter().enumerate() {
            // The sampler sees the weights after `step` optimizer steps.
            assert_eq!(s.tokens, vec![100 * step + i as u32 + 10, EOS]);
            assert_eq!(s.logprobs, vec![-0.25, -0.25]);
            assert_eq!(s.stop_reason, StopReason::Stop);
            assert_eq!(s.sequence_id, None);
        }
        let data: Vec<Datum> = seqs
            .iter()
            .enumerate()
            .map(|(i, s)| datum(&[5, 6, 7], &s.tokens, if i % 2 == 0 { 1.0 } else { -1.0 }))
            .collect();
        let fb = backend
            .forward_backward(data, LossFn::ImportanceSampling)
            .await
            .unwrap();
        let opt = backend
            .optim_step(AdamParams {
                learning_rate: 1e-4,
                ..Default::default()
            })
            .await
            .unwrap();
        let fb = fb.await.unwrap();
        assert_eq!(fb.loss_fn_outputs.len(), 4);
        assert_eq!(fb.loss_fn_output_type, "ArrayRecord");
        assert_eq!(
            fb.loss_fn_outputs[0]["logprobs"].as_f32().unwrap(),
            &[-0.5; 4]
        );
        assert_eq!(fb.metrics["datums:mean"], 4.0);
        let opt = opt.await.unwrap();
        assert_eq!(opt.metrics["grads:sum"], 4.0);
        sampler = backend.sampler().await.unwrap();
    }
    client.close().await.unwrap();

    let s = st.lock().unwrap();
    assert!(s.faults.is_empty(), "faults not triggered: {:?}", s.faults);
    assert!(s.finished, "session finished");
    assert_eq!(s.models["fake-session:train:0"].version, 3);
    // Pipelining: seq 1 was the first sampler; forward_backward (2) and optim_step (3)
    // both arrived before the forward_backward result was delivered.
    let at = |e: &str| {
        s.events
            .iter()
            .position(|x| x == e)
            .unwrap_or_else(|| panic!("{e}: {:?}", s.events))
    };
    let fb = at("forward_backward 2");
    let opt = at("optim_step 3");
    let first_result = fb
        + s.events[fb..]
            .iter()
            .position(|e| e.starts_with("result"))
            .unwrap();
    assert!(fb < opt && opt < first_result, "{:?}", s.events);
}

#[tokio::test]
async fn failed_promise_is_a_typed_error_naming_the_request() {
    let (config, st) = start(FakeOptions {
        chunk_len: 1024,
        ..Default::default()
    })
    .await;
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    st.lock().unwrap().fail_next_forward_backward = true;
    let pending = backend
        .forward_backward(
            vec![datum(&[1, 2], &[3, EOS], 1.0)],
            LossFn::ImportanceSampling,
        )
        .await
        .unwrap();
    match pending.await {
        Err(Error::RequestFailed {
            request,
            category,
            message,
        }) => {
            assert_eq!(request, "forward_backward seq 1");
            assert_eq!(category, "user");
            assert!(message.contains("loss is NaN"), "{message}");
        }
        other => panic!("expected RequestFailed, got {other:?}"),
    }
    // The backend stays usable; the next request takes seq 2.
    let out = backend
        .optim_step(AdamParams::default())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(out.metrics["grads:sum"], 0.0);
    client.close().await.unwrap();
}

#[tokio::test]
async fn a_lost_submission_fails_later_training_calls_fast() {
    let (config, st) = start(FakeOptions {
        chunk_len: 1024,
        ..Default::default()
    })
    .await;
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    // optim_step (seq 1) is refused for good: its seq_id is never filled on the server.
    st.lock()
        .unwrap()
        .faults
        .push_back(("optim_step".into(), Fault::Status(400)));
    let err = backend.optim_step(AdamParams::default()).await.unwrap_err();
    assert!(matches!(err, Error::Http { status: 400, .. }), "{err:?}");
    // Later training calls fail at once, naming the lost request, and send nothing.
    let sent_before = st.lock().unwrap().events.len();
    let err = backend
        .forward_backward(
            vec![datum(&[1, 2], &[3, EOS], 1.0)],
            LossFn::ImportanceSampling,
        )
        .await
        .expect_err("forward_backward after a lost submission must fail");
    match &err {
        Error::RequestFailed {
            request, category, ..
        } => {
            assert_eq!(request, "optim_step seq 1");
            assert_eq!(category, "client");
        }
        other => panic!("expected RequestFailed, got {other:?}"),
    }
    assert!(err.to_string().contains("load_state"), "{err}");
    assert!(matches!(
        backend.sampler().await,
        Err(Error::RequestFailed { .. })
    ));
    assert!(matches!(
        backend.save_state("after").await,
        Err(Error::RequestFailed { .. })
    ));
    assert_eq!(st.lock().unwrap().events.len(), sent_before);
    assert_eq!(
        st.lock().unwrap().models["fake-session:train:0"].expected_seq,
        1
    );
    client.close().await.unwrap();
}

#[tokio::test]
async fn fake_rejects_out_of_order_seq_ids() {
    // The ordering check the other tests rely on really rejects a gap.
    let (config, st) = start(FakeOptions::default()).await;
    let client = TinkerClient::connect(config.clone()).await.unwrap();
    let _backend = backend(&client).await;
    let url = format!("{}/api/v1/optim_step", config.base_url_str());
    let resp = reqwest::Client::new()
        .post(url)
        .header("x-api-key", KEY)
        .header("x-idempotency-key", "test")
        .json(&json!({"model_id": "fake-session:train:0", "seq_id": 2, "type": "optim_step", "adam_params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(resp.text().await.unwrap().contains("out-of-order"));
    assert_eq!(
        st.lock().unwrap().models["fake-session:train:0"].expected_seq,
        1
    );
    client.close().await.unwrap();
}

#[tokio::test]
async fn chunked_forward_backward_merges_outputs_and_metrics() {
    let (config, st) = start(FakeOptions {
        chunk_len: 2,
        ..Default::default()
    })
    .await;
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    let data: Vec<Datum> = (0..5).map(|i| datum(&[1, 2], &[3 + i, EOS], 1.0)).collect();
    let out = backend
        .forward_backward(data, LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(out.loss_fn_outputs.len(), 5);
    // loss:sum adds up the chunks (−2 per datum); datums:mean is weighted by chunk size.
    assert_eq!(out.metrics["loss:sum"], -10.0);
    assert_eq!(
        out.metrics["datums:mean"],
        (2.0 * 2.0 + 2.0 * 2.0 + 1.0) / 5.0
    );
    let events = st.lock().unwrap().events.clone();
    let fbs: Vec<&String> = events
        .iter()
        .filter(|e| e.starts_with("forward_backward"))
        .collect();
    assert_eq!(
        fbs,
        [
            "forward_backward 1",
            "forward_backward 2",
            "forward_backward 3"
        ]
    );

    client.close().await.unwrap();
}

#[tokio::test]
async fn save_and_load_state_both_load_forms() {
    for legacy in [false, true] {
        let (config, st) = start(FakeOptions {
            chunk_len: 1024,
            legacy_load_only: legacy,
            ..Default::default()
        })
        .await;
        let client = TinkerClient::connect(config).await.unwrap();
        let backend = backend(&client).await;
        backend
            .optim_step(AdamParams::default())
            .await
            .unwrap()
            .await
            .unwrap();
        let ckpt = backend.save_state("step-1").await.unwrap();
        assert_eq!(ckpt.path, "tinker://fake-session:train:0/weights/step-1");
        backend
            .optim_step(AdamParams::default())
            .await
            .unwrap()
            .await
            .unwrap();
        backend.load_state(&ckpt).await.unwrap();
        let sampler = backend.sampler().await.unwrap();
        let seqs = sampler
            .sample(
                &ModelInput::from_tokens(vec![1]),
                1,
                &SamplingParams::default().max_tokens(2),
            )
            .await
            .unwrap();
        assert_eq!(
            seqs[0].tokens[0], 110,
            "sampling from the restored (1-step) weights"
        );
        let events = st.lock().unwrap().events.clone();
        let model_id = backend.model_id().await;
        if legacy {
            assert!(events.contains(&"load_weights 1".to_string()), "{events:?}");
            // 422 for the one-request form (model_seq_id 1), then create_model (2) + load.
            assert_eq!(model_id, "fake-session:train:2");
        } else {
            let new = "load_weights new fake-session:train:1".to_string();
            assert!(events.contains(&new), "{events:?}");
            assert_eq!(model_id, "fake-session:train:1");
        }
        client.close().await.unwrap();
    }
}

#[tokio::test]
async fn compute_logprobs_and_reference_sampler() {
    let (config, st) = start(FakeOptions::default()).await;
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    let reference = backend.reference_sampler().await.unwrap();
    let lps = reference
        .compute_logprobs(&ModelInput::from_tokens(vec![4, 5, 6]))
        .await
        .unwrap();
    assert_eq!(lps, vec![None, Some(-1.0), Some(-2.0)]);
    // Sampler seq ids count from 0 per sampler.
    reference
        .sample(
            &ModelInput::from_tokens(vec![4]),
            1,
            &SamplingParams::default(),
        )
        .await
        .unwrap();
    let seqs: Vec<u64> = st
        .lock()
        .unwrap()
        .sample_seqs
        .iter()
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(seqs, vec![0, 1]);
    // Heartbeats run in the background while the session is open.
    for _ in 0..100 {
        if st.lock().unwrap().heartbeats > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(st.lock().unwrap().heartbeats > 0);
    client.close().await.unwrap();
    assert!(st.lock().unwrap().finished);
}

#[tokio::test]
async fn grpo_trainer_runs_against_the_fake_server() {
    use rlvr::{GrpoTrainer, TrainerConfig};
    let (config, st) = start(FakeOptions {
        chunk_len: 1024,
        ..Default::default()
    })
    .await;
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let problems: Vec<rlvr::dataset::Problem> = (0..4)
        .map(|i| rlvr::dataset::Problem::new(format!("p{i}"), format!("q{i}"), "even"))
        .collect();
    // The fake samples token 100·version + 10 + i: even ids score 1 → mixed groups.
    let reward = |_: &rlvr::dataset::Problem, text: &str| match text.parse::<u32>() {
        Ok(id) if id % 2 == 0 => 1.0,
        _ => 0.0,
    };
    let config = TrainerConfig::builder()
        .batch_size(2)
        .group_size(4)
        .max_tokens(4)
        .max_steps(3)
        .save_every(2)
        .eval_every(0)
        .kl_penalty_coef(0.1)
        .progress(false)
        .log_dir(dir.path())
        .build()
        .unwrap();
    let summary = GrpoTrainer::new(
        backend,
        reward,
        Arc::new(IdRenderer { eos: EOS }),
        Arc::new(problems),
        config,
    )
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(summary.steps_run, 3);
    let last = summary.last_step.unwrap();
    assert_eq!(last.reward_mean, 0.5);
    assert_eq!(last.datums, 8);
    // Learner −0.5 vs sampler −0.25 on every action token.
    assert!((last.values["optim/kl_sample_train_v1"] - 0.25).abs() < 1e-9);
    assert!(last.values.contains_key("kl_policy_base"));
    client.close().await.unwrap();

    let rows = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 3);
    let ckpts = std::fs::read_to_string(dir.path().join("checkpoints.jsonl")).unwrap();
    assert_eq!(ckpts.lines().count(), 2, "000002 and final");
    assert!(dir.path().join("samples/000002.html").is_file());

    let s = st.lock().unwrap();
    assert_eq!(s.models["fake-session:train:0"].version, 3);
    // Pipelining: the first optim_step was submitted before the first forward_backward's
    // result was delivered.
    let at = |prefix: &str| s.events.iter().position(|e| e.starts_with(prefix)).unwrap();
    let fb = at("forward_backward");
    let opt = at("optim_step");
    let first_result = fb
        + s.events[fb..]
            .iter()
            .position(|e| e.starts_with("result"))
            .unwrap();
    assert!(fb < opt && opt < first_result, "{:?}", s.events);
}

#[tokio::test]
async fn jwt_auth_exchanges_the_key_and_replays_after_invalid_token() {
    let (config, st) = start(FakeOptions {
        jwt: true,
        ..Default::default()
    })
    .await;
    st.lock()
        .unwrap()
        .faults
        .push_back(("get_info".into(), Fault::InvalidToken));
    let client = TinkerClient::connect(config).await.unwrap();
    assert_eq!(
        st.lock().unwrap().issued.len(),
        1,
        "one exchange at start-up"
    );
    // get_info is rejected once as an expired token: a new exchange, then the replay.
    let backend = backend(&client).await;
    backend
        .optim_step(AdamParams::default())
        .await
        .unwrap()
        .await
        .unwrap();
    {
        let s = st.lock().unwrap();
        assert!(s.faults.is_empty());
        assert_eq!(s.issued.len(), 2, "re-exchanged once after invalid_token");
    }
    client.close().await.unwrap();
    assert!(st.lock().unwrap().finished);
}

/// A tracing writer into a shared buffer.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_api_key_never_appears_in_logs_debug_output_or_errors() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // A current-thread runtime: every task of the flow logs through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);

    let (config, st) = start(FakeOptions {
        chunk_len: 1024,
        ..Default::default()
    })
    .await;
    let url = config.base_url_str().to_string();
    let mut shown = vec![format!("{config:?}")];
    {
        let mut s = st.lock().unwrap();
        s.faults
            .push_back(("forward_backward".into(), Fault::Status(503)));
        s.faults.push_back(("asample".into(), Fault::Status(400)));
    }
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    let fb = backend
        .forward_backward(
            vec![datum(&[1, 2], &[3, EOS], 1.0)],
            LossFn::ImportanceSampling,
        )
        .await
        .unwrap();
    let opt = backend.optim_step(AdamParams::default()).await.unwrap();
    fb.await.unwrap();
    opt.await.unwrap();
    let sampler = backend.sampler().await.unwrap();
    let params = SamplingParams::default().max_tokens(4);
    let prompt = ModelInput::from_tokens(vec![5, 6, 7]);
    // The injected 400 is not retried: an error surfaces.
    let err = sampler.sample(&prompt, 2, &params).await.unwrap_err();
    shown.push(format!("{err:?}"));
    shown.push(err.to_string());
    sampler.sample(&prompt, 2, &params).await.unwrap();
    // A refused credential (the server sees a wrong key) is an error too.
    let bad =
        TinkerClient::connect(TinkerConfig::new("tml-wrong-key").unwrap().base_url(url)).await;
    if let Err(e) = &bad {
        shown.push(format!("{e:?}"));
        shown.push(e.to_string());
    }
    shown.push(format!("{client:?}"));
    shown.push(format!("{backend:?}"));
    shown.push(format!("{sampler:?}"));
    client.close().await.unwrap();

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("forward_backward") || logs.contains("503"),
        "the flow was logged at TRACE: {logs}"
    );
    assert!(!logs.contains(KEY), "the key leaked into the logs");
    for s in &shown {
        assert!(!s.contains(KEY), "the key leaked: {s}");
    }
}

/// `rlvr::loss::forward_backward_custom` on Tinker sends what the SDK's does: a forward-only
/// `cross_entropy` request with `target_tokens` and zero `weights`, then a `cross_entropy`
/// `forward_backward` with `weights = −∂loss/∂logprobs`; `loss:sum` is the custom loss.
#[tokio::test]
async fn forward_backward_custom_sends_the_sdks_two_requests() {
    use rlvr::backend::tinker::proto::{parse_f32_le, parse_i64_le, tensor::Encoding};
    use rlvr::loss::{ImportanceSamplingLoss, forward_backward_custom};
    let (config, st) = start(FakeOptions {
        chunk_len: 1024,
        ..Default::default()
    })
    .await;
    let client = TinkerClient::connect(config).await.unwrap();
    let backend = backend(&client).await;
    let data = vec![
        datum(&[1, 2], &[3, EOS], 1.0),
        datum(&[1, 2, 4], &[5, 6, EOS], -0.5),
    ];
    let out = forward_backward_custom(&backend, data.clone(), &ImportanceSamplingLoss)
        .await
        .unwrap();
    // The fake's learner logprobs are −0.5 everywhere and the sampler's −0.25 on actions: on
    // an action token r = exp(−0.25) and ∂(−r·A)/∂lp = −r·A, so the weight is r·A.
    let r = (-0.25f64).exp();
    let want_loss: f64 = -data
        .iter()
        .flat_map(|d| d.advantages().unwrap())
        .map(|&a| r * a as f64)
        .sum::<f64>();
    assert!(
        (out.metrics["loss:sum"] - want_loss).abs() < 1e-6,
        "{:?}",
        out.metrics
    );
    assert!(out.metrics.contains_key("surrogate_loss:sum"));
    let reqs = st.lock().unwrap().fb_requests.clone();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[0].forward_only && !reqs[1].forward_only);
    let f32s = |d: &proto::Datum, k: &str| match &d.loss_fn_inputs[k].encoding {
        Some(Encoding::Dense(b)) => parse_f32_le(b).unwrap(),
        other => panic!("{k}: {other:?}"),
    };
    for (req, zero) in [(&reqs[0], true), (&reqs[1], false)] {
        assert_eq!(req.loss_fn, "cross_entropy");
        assert_eq!(req.data.len(), 2);
        for (pd, d) in req.data.iter().zip(&data) {
            let keys: Vec<&String> = pd.loss_fn_inputs.keys().collect();
            assert_eq!(keys, ["target_tokens", "weights"]);
            let targets = match &pd.loss_fn_inputs["target_tokens"].encoding {
                Some(Encoding::Dense(b)) => parse_i64_le(b).unwrap(),
                other => panic!("target_tokens: {other:?}"),
            };
            assert_eq!(targets, d.target_tokens().unwrap());
            let w = f32s(pd, "weights");
            let want: Vec<f32> = d
                .advantages()
                .unwrap()
                .iter()
                .map(|&a| if zero { 0.0 } else { (r * a as f64) as f32 })
                .collect();
            assert_eq!(w.len(), want.len());
            for (g, w) in w.iter().zip(&want) {
                assert!((g - w).abs() < 1e-6, "weights {g} vs {w}");
            }
        }
    }
    client.close().await.unwrap();
}
