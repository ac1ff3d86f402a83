//! Fault soak of the Tinker backend: 50-step `GrpoTrainer` runs against an in-process,
//! seeded, fault-injecting Tinker-compatible server.
//!
//! About 10% of requests (after session creation) get a fault: 500/502/503, 429 with
//! `Retry-After`, 408, a connection reset before the server looked at the request, a reset
//! after it applied it (the client never sees the answer), a slow long-poll past the client's
//! poll timeout, a truncated body, or a malformed (cut-off JSON) body after applying. The
//! fake dedupes like a server that honours the protocol's retry rules: an HTTP-layer retry
//! (same `X-Idempotency-Key`) gets the stored answer, and a holder-level retry (new key, same
//! model `seq_id`, same body) gets the stored answer of that `seq_id` — neither is applied
//! twice. Fault decisions hash (seed, endpoint, body, how often that body was seen), never the
//! clock or the arrival order of concurrent requests, and future ids are named by their
//! submission, so a seed always means the same faults (the test checks it with a second run).

use crate::common::IdRenderer;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use prost::Message;
use rlvr::backend::tinker::proto;
use rlvr::backend::tinker::{TinkerBackendOptions, TinkerClient, TinkerConfig};
use rlvr::{Error, types::LoraConfig};
use rlvr::{GrpoTrainer, TrainerConfig};
use serde_json::{Value, json};

const KEY: &str = "tml-soak-key";
const EOS: u32 = 2;
const STEPS: u64 = 50;
/// The client's long-poll timeout; a slow poll holds the request longer than this.
const POLL_TIMEOUT: Duration = Duration::from_millis(300);

/// What the fake does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    /// This status (`{"detail"}` body; 502 with a proxy's HTML page) without looking at it.
    Status(u16),
    /// 429 with `Retry-After: 1` and `retry-after-ms: 20`, without looking at it.
    TooMany,
    /// Close the connection before looking at the request.
    ResetBefore,
    /// Apply the request, then close the connection without an answer.
    ResetAfter,
    /// Hold a long-poll past the client's timeout, then answer (to nobody).
    SlowPoll,
    /// Apply, then send half the body and close the connection.
    Truncated,
    /// Apply, then answer 200 with cut-off JSON.
    Malformed,
}

/// A fatal fault for the second test: the `nth` (0-based) request to `path` gets `status`.
#[derive(Debug, Clone)]
struct Fatal {
    path: &'static str,
    nth: usize,
    status: u16,
}

#[derive(Clone)]
struct Reply {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Reply {
    fn json(v: Value) -> Reply {
        Reply {
            status: 200,
            content_type: "application/json",
            body: v.to_string().into_bytes(),
        }
    }
    fn detail(status: u16, msg: impl Into<String>) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: json!({ "detail": msg.into() }).to_string().into_bytes(),
        }
    }
    fn into_response(self) -> Response {
        (
            StatusCode::from_u16(self.status).unwrap(),
            [("content-type", self.content_type)],
            self.body,
        )
            .into_response()
    }
}

struct Model {
    expected_seq: i64,
    version: u32,
    pending_grads: usize,
}

#[derive(Default)]
struct Fake {
    seed: u64,
    /// Fault probability in percent.
    rate: u64,
    fatal: Option<Fatal>,
    models: HashMap<String, Model>,
    futures: HashMap<String, (u32, Reply)>,
    /// Hash of the request being applied (path and body).
    current: u64,
    sampling_sessions: HashMap<String, u32>,
    /// Answers by idempotency key (HTTP-layer retries).
    by_key: HashMap<String, Reply>,
    /// Answers by (model, seq_id) with the request body (holder-level retries).
    by_seq: HashMap<(String, i64), (Vec<u8>, Reply)>,
    /// How often each (path, body) was seen, for the fault hash.
    seen: HashMap<u64, u64>,
    /// Requests per path, for fatal faults.
    per_path: HashMap<String, usize>,
    /// `optim_step` seq_ids in the order they were applied.
    optim_applied: Vec<i64>,
    /// Faults injected, by kind.
    injected: BTreeMap<Fault, usize>,
    /// Retries answered from the stores instead of being applied again.
    replayed_by_key: usize,
    replayed_by_seq: usize,
    /// Requests that could get a fault.
    requests: usize,
    finished: bool,
}

type Shared = Arc<Mutex<Fake>>;

fn hash_of(parts: &[&[u8]]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

/// What identifies a request: path and body, but without what differs between runs by
/// design — an `asample`'s `seq_id` (concurrent samples of one sampler take them in whatever
/// order they run) and the random prefix of a checkpoint name (`<8 hex>-000010`).
fn request_hash(path: &str, body: &[u8]) -> u64 {
    if (path == "asample" || path == "save_weights")
        && let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(body)
    {
        m.remove("seq_id");
        if let Some(Value::String(p)) = m.get_mut("path")
            && let Some((_, name)) = p.split_once('-')
        {
            *p = name.to_string();
        }
        return hash_of(&[path.as_bytes(), Value::Object(m).to_string().as_bytes()]);
    }
    hash_of(&[path.as_bytes(), body])
}

/// The endpoints faults go to: everything after the session exists, but not the heartbeat
/// (its timing is wall-clock) nor the session finish.
fn faultable(path: &str) -> bool {
    !matches!(
        path,
        "client/config" | "client/dynamic_config" | "create_session" | "session_heartbeat"
    ) && !path.ends_with("/finish")
}

impl Fake {
    fn decide(&mut self, path: &str, body: &[u8]) -> Option<Fault> {
        if !faultable(path) || self.rate == 0 {
            return None;
        }
        let key = request_hash(path, body);
        let n = self.seen.entry(key).or_default();
        *n += 1;
        let h = hash_of(&[
            &self.seed.to_le_bytes(),
            &key.to_le_bytes(),
            &n.to_le_bytes(),
        ]);
        if h % 100 >= self.rate {
            return None;
        }
        let kinds: &[Fault] = &[
            Fault::Status(500),
            Fault::Status(502),
            Fault::Status(503),
            Fault::TooMany,
            Fault::Status(408),
            Fault::ResetBefore,
            Fault::ResetAfter,
            Fault::SlowPoll,
            Fault::Truncated,
            Fault::Malformed,
        ];
        let mut f = kinds[((h / 100) % kinds.len() as u64) as usize];
        if f == Fault::SlowPoll && path != "retrieve_future" {
            f = Fault::ResetAfter;
        }
        Some(f)
    }

    fn promise(&mut self, result: Reply, model_id: Option<&str>) -> Reply {
        // Named by the submission (not by arrival order), so poll bodies, and with them the
        // fault decisions, do not depend on how concurrent requests interleave.
        let id = format!("req-{:016x}", self.current);
        self.futures.insert(id.clone(), (1, result));
        let mut v = json!({ "request_id": id });
        if let Some(m) = model_id {
            v["model_id"] = json!(m);
        }
        Reply::json(v)
    }

    /// Checks the model's seq_id; `Ok(None)` = in order (advanced), `Ok(Some)` = a replay of
    /// an applied request.
    fn sequence(&mut self, model_id: &str, seq: i64, body: &[u8]) -> Result<Option<Reply>, Reply> {
        let Some(m) = self.models.get_mut(model_id) else {
            return Err(Reply::detail(404, format!("unknown model {model_id}")));
        };
        if seq < m.expected_seq
            && let Some((b, r)) = self.by_seq.get(&(model_id.to_string(), seq))
            && b == body
        {
            self.replayed_by_seq += 1;
            return Ok(Some(r.clone()));
        }
        if seq != m.expected_seq {
            return Err(Reply::detail(
                400,
                format!("out-of-order seq_id {seq}; expected {}", m.expected_seq),
            ));
        }
        m.expected_seq += 1;
        Ok(None)
    }

    fn remember(&mut self, model_id: &str, seq: i64, body: &[u8], reply: &Reply) {
        self.by_seq
            .insert((model_id.to_string(), seq), (body.to_vec(), reply.clone()));
    }

    /// The sampled token `i` of a prompt under weights `version`: a seeded hash, so rewards
    /// vary from step to step but never between runs.
    fn token(&self, prompt: &[i64], version: u32, i: usize) -> i32 {
        let p: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
        let h = hash_of(&[
            &self.seed.to_le_bytes(),
            &p,
            &version.to_le_bytes(),
            &i.to_le_bytes(),
        ]);
        10 + (h % 50) as i32
    }

    fn forward_backward(&mut self, body: &[u8]) -> Reply {
        let req = match proto::ForwardBackwardRequest::decode(body) {
            Ok(r) => r,
            Err(e) => return Reply::detail(400, format!("bad protobuf: {e}")),
        };
        let seq = req.seq_id as i64;
        match self.sequence(&req.model_id, seq, body) {
            Err(r) | Ok(Some(r)) => return r,
            Ok(None) => {}
        }
        let n = req.data.len();
        if let Some(m) = self.models.get_mut(&req.model_id) {
            m.pending_grads += n;
        }
        let out = crate::common::fake_forward_backward_output(&req.data);
        let result = Reply {
            status: 200,
            content_type: "application/x-protobuf",
            body: out.encode_to_vec(),
        };
        let model = req.model_id.clone();
        let r = self.promise(result, Some(&model));
        self.remember(&model, seq, body, &r);
        r
    }

    fn handle_json(&mut self, path: &str, raw: &[u8]) -> Reply {
        let b: Value = match serde_json::from_slice(raw) {
            Ok(v) => v,
            Err(e) => return Reply::detail(400, format!("bad JSON: {e}")),
        };
        let s = |k: &str| b[k].as_str().unwrap_or_default().to_string();
        let seq = b["seq_id"].as_i64().unwrap_or(-1);
        match path {
            "client/config" => Reply::json(json!({
                "proto_compress_fwdbwd": false,
                "fwdbwd_max_chunk_len": 1024,
                "parallel_fwdbwd_chunks": false,
            })),
            "client/dynamic_config" => Reply::detail(404, "Not Found"),
            "create_session" => {
                Reply::json(json!({"type": "create_session", "session_id": "soak-session"}))
            }
            "session_heartbeat" => Reply::json(json!({"type": "session_heartbeat"})),
            "create_model" => {
                let id = format!("soak-session:train:{}", b["model_seq_id"]);
                if !self.models.contains_key(&id) {
                    self.models.insert(
                        id.clone(),
                        Model {
                            expected_seq: 1,
                            version: 0,
                            pending_grads: 0,
                        },
                    );
                }
                let r = json!({"model_id": id, "type": "create_model"});
                self.promise(Reply::json(r), Some(&id))
            }
            "get_info" => match self.models.get(&s("model_id")) {
                Some(_) => Reply::json(json!({
                    "type": "get_info",
                    "model_id": s("model_id"),
                    "model_data": {"arch": "qwen3", "model_name": "fake/tiny"},
                    "is_lora": true,
                })),
                None => Reply::detail(404, "unknown model"),
            },
            "optim_step" => {
                let model_id = s("model_id");
                match self.sequence(&model_id, seq, raw) {
                    Err(r) | Ok(Some(r)) => return r,
                    Ok(None) => {}
                }
                let m = self.models.get_mut(&model_id).unwrap();
                m.version += 1;
                let grads = std::mem::take(&mut m.pending_grads);
                self.optim_applied.push(seq);
                let lr = b["adam_params"]["learning_rate"].as_f64().unwrap_or(0.0);
                let r = json!({"metrics": {"learning_rate:mean": lr, "grads:sum": grads}});
                let r = self.promise(Reply::json(r), Some(&model_id));
                self.remember(&model_id, seq, raw, &r);
                r
            }
            "save_weights_for_sampler" | "save_weights" => {
                let model_id = s("model_id");
                match self.sequence(&model_id, seq, raw) {
                    Err(r) | Ok(Some(r)) => return r,
                    Ok(None) => {}
                }
                let version = self.models[&model_id].version;
                let result = if path == "save_weights" {
                    let p = format!("tinker://{model_id}/weights/{}", s("path"));
                    json!({"path": p, "type": "save_weights"})
                } else {
                    let id = format!("soak-session:sample:{}", b["sampling_session_seq_id"]);
                    self.sampling_sessions.insert(id.clone(), version);
                    json!({"path": format!("tinker://{model_id}/sampler_weights/s{version}"), "sampling_session_id": id})
                };
                let r = self.promise(Reply::json(result), Some(&model_id));
                self.remember(&model_id, seq, raw, &r);
                r
            }
            "create_sampling_session" => {
                let id = format!("soak-session:sample:{}", b["sampling_session_seq_id"]);
                self.sampling_sessions.insert(id.clone(), 0);
                Reply::json(json!({"type": "create_sampling_session", "sampling_session_id": id}))
            }
            "asample" => {
                let sid = s("sampling_session_id");
                let Some(&version) = self.sampling_sessions.get(&sid) else {
                    return Reply::detail(404, format!("unknown sampling session {sid}"));
                };
                let n = b["num_samples"].as_u64().unwrap_or(1) as usize;
                let prompt: Vec<i64> = b["prompt"]["chunks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|c| c["tokens"].as_array().cloned().unwrap_or_default())
                    .map(|t| t.as_i64().unwrap_or(0))
                    .collect();
                let sequences = (0..n)
                    .map(|i| {
                        let toks = vec![self.token(&prompt, version, i), EOS as i32];
                        proto::SampledSequence {
                            stop_reason: proto::StopReason::Stop as i32,
                            logprobs: Some(proto::f32_le(&[-0.25, -0.25]).into()),
                            tokens: proto::i32_le(toks).into(),
                            topk_sampled_logprobs: None,
                        }
                    })
                    .collect();
                let resp = proto::SampleResponse {
                    sequences,
                    ..Default::default()
                };
                let result = Reply {
                    status: 200,
                    content_type: "application/x-protobuf",
                    body: resp.encode_to_vec(),
                };
                self.promise(result, None)
            }
            "retrieve_future" => {
                let id = s("request_id");
                let Some((try_again, result)) = self.futures.get_mut(&id) else {
                    return Reply::detail(404, format!("unknown future {id}"));
                };
                if *try_again > 0 {
                    *try_again -= 1;
                    return Reply::json(
                        json!({"type": "try_again", "request_id": id, "queue_state": "active"}),
                    );
                }
                result.clone()
            }
            p if p.starts_with("sessions/") && p.ends_with("/finish") => {
                self.finished = true;
                Reply::json(json!({}))
            }
            other => Reply::detail(404, format!("no endpoint {other}")),
        }
    }

    fn apply(&mut self, path: &str, body: &[u8]) -> Reply {
        self.current = request_hash(path, body);
        if path == "forward_backward" {
            self.forward_backward(body)
        } else {
            self.handle_json(path, body)
        }
    }
}

async fn handle(State(st): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().trim_start_matches("/api/v1/").to_string();
    if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some(KEY) {
        return Reply::detail(401, "bad credential").into_response();
    }
    let Some(key) = headers
        .get("x-idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return Reply::detail(400, "missing X-Idempotency-Key").into_response();
    };
    let fault = {
        let mut st = st.lock().unwrap();
        if faultable(&path) {
            st.requests += 1;
        }
        let nth = {
            let c = st.per_path.entry(path.clone()).or_default();
            *c += 1;
            *c - 1
        };
        if let Some(f) = &st.fatal
            && f.path == path
            && f.nth == nth
        {
            let status = f.status;
            return Reply::detail(status, format!("injected fatal {status}")).into_response();
        }
        // An HTTP-layer retry of an applied request: the stored answer.
        if let Some(r) = st.by_key.get(&key).cloned() {
            st.replayed_by_key += 1;
            return r.into_response();
        }
        let f = st.decide(&path, &body);
        if let Some(f) = f {
            *st.injected.entry(f).or_default() += 1;
        }
        f
    };
    match fault {
        Some(Fault::Status(502)) => {
            return (
                StatusCode::BAD_GATEWAY,
                [("content-type", "text/html")],
                "<html><body><h1>502 Bad Gateway</h1></body></html>",
            )
                .into_response();
        }
        Some(Fault::Status(code)) => return Reply::detail(code, "injected").into_response(),
        Some(Fault::TooMany) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "1"), ("retry-after-ms", "20")],
                "slow down",
            )
                .into_response();
        }
        // Unwinding the connection task closes the socket without an answer.
        Some(Fault::ResetBefore) => std::panic::resume_unwind(Box::new("injected reset")),
        // The answer goes to nobody, so the hold changes no state (the client's next poll
        // may overtake it).
        Some(Fault::SlowPoll) => {
            tokio::time::sleep(POLL_TIMEOUT + POLL_TIMEOUT / 2).await;
            return Reply::json(json!({"type": "try_again", "queue_state": "active"}))
                .into_response();
        }
        _ => {}
    }
    let reply = {
        let mut st = st.lock().unwrap();
        let r = st.apply(&path, &body);
        // Polls are reads; everything else is stored under its key once answered.
        if path != "retrieve_future" && r.status == 200 {
            st.by_key.insert(key, r.clone());
        }
        r
    };
    match fault {
        Some(Fault::ResetAfter) => std::panic::resume_unwind(Box::new("injected reset")),
        Some(Fault::Truncated) => {
            let full = reply.body.len();
            let half = Bytes::from(reply.body[..full / 2].to_vec());
            let stream = futures::stream::iter(vec![
                Ok::<_, std::io::Error>(half),
                Err(std::io::Error::other("injected truncation")),
            ]);
            Response::builder()
                .status(reply.status)
                .header("content-type", reply.content_type)
                .header("content-length", full.to_string())
                .body(Body::from_stream(stream))
                .unwrap()
        }
        Some(Fault::Malformed) => {
            let cut = reply.body.len() / 2;
            let mut b = br#"{"request_id": "#.to_vec();
            b.extend_from_slice(&reply.body[..cut.min(8)]);
            (StatusCode::OK, [("content-type", "application/json")], b).into_response()
        }
        _ => reply.into_response(),
    }
}

async fn start(seed: u64, rate: u64, fatal: Option<Fatal>) -> (TinkerConfig, Shared) {
    let st: Shared = Arc::new(Mutex::new(Fake {
        seed,
        rate,
        fatal,
        ..Default::default()
    }));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(Arc::clone(&st));
    let addr = crate::common::serve(app).await;
    let config = TinkerConfig::new(KEY)
        .unwrap()
        .base_url(format!("http://{addr}"))
        .heartbeat_interval(Duration::from_millis(200))
        .request_timeout(Duration::from_secs(5))
        .poll_timeout(POLL_TIMEOUT)
        .backoff_scale(0.01);
    (config, st)
}

/// One training run against a fake with `rate`% faults; returns the run's outcome, the
/// metrics rows without the `time/*` entries, and the server.
async fn run(
    seed: u64,
    rate: u64,
    fatal: Option<Fatal>,
    dir: &std::path::Path,
) -> (rlvr::Result<rlvr::trainer::RunSummary>, Vec<Value>, Shared) {
    let (config, st) = start(seed, rate, fatal).await;
    let client = TinkerClient::connect(config).await.unwrap();
    let tokenizer = rlvr::tokenizer::Tokenizer::new(
        tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default()),
        None,
        Some(EOS),
    );
    let backend = client
        .create_lora_training_with(
            "fake/tiny",
            LoraConfig::new(8),
            TinkerBackendOptions {
                tokenizer: Some(tokenizer),
            },
        )
        .await
        .unwrap();
    let problems: Vec<rlvr::dataset::Problem> = (0..8)
        .map(|i| rlvr::dataset::Problem::new(format!("p{i}"), format!("q{i}"), "even"))
        .collect();
    let reward = |_: &rlvr::dataset::Problem, text: &str| match text.parse::<u32>() {
        Ok(id) if id % 2 == 0 => 1.0,
        _ => 0.0,
    };
    let config = TrainerConfig::builder()
        .batch_size(2)
        .group_size(2)
        .max_tokens(4)
        .max_steps(STEPS)
        .save_every(10)
        .eval_every(0)
        .seed(seed)
        .progress(false)
        .log_dir(dir)
        .build()
        .unwrap();
    let result = match GrpoTrainer::new(
        backend,
        reward,
        Arc::new(IdRenderer { eos: EOS }),
        Arc::new(problems),
        config,
    ) {
        Ok(mut t) => t.run().await,
        Err(e) => Err(e),
    };
    client.close().await.unwrap();
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "metrics.jsonl ends mid-row: {text:?}"
    );
    let ckpts = std::fs::read_to_string(dir.join("checkpoints.jsonl")).unwrap_or_default();
    assert!(ckpts.is_empty() || ckpts.ends_with('\n'), "{ckpts:?}");
    for l in ckpts.lines() {
        serde_json::from_str::<Value>(l)
            .unwrap_or_else(|e| panic!("half-written checkpoint row {l:?}: {e}"));
    }
    let rows = text
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("half-written metrics row {l:?}: {e}"));
            if let Value::Object(m) = &mut v {
                m.retain(|k, _| !k.starts_with("time/"));
            }
            v
        })
        .collect();
    (result, rows, st)
}

/// Metrics rows of steps that trained (had datums, so took an optimizer step).
fn trained_steps(rows: &[Value]) -> usize {
    rows.iter()
        .filter(|r| r["train/datums"].as_f64().unwrap_or(0.0) > 0.0)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_steps_through_faults_match_the_fault_free_run() {
    // `RLVR_SOAK_SEED` / `RLVR_SOAK_RATE` (percent) soak other fault sequences.
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let seed = env("RLVR_SOAK_SEED", 7);
    let rate = env("RLVR_SOAK_RATE", 10);
    let clean_dir = tempfile::tempdir().unwrap();
    let (clean, clean_rows, clean_st) = run(seed, 0, None, clean_dir.path()).await;
    let clean = clean.expect("the fault-free run");
    assert_eq!(clean.steps_run, STEPS);
    assert_eq!(clean_rows.len(), STEPS as usize);

    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (soaked, rows, st) = run(seed, rate, None, dir.path()).await;
    let soaked = soaked.expect("the run under faults finishes");
    let elapsed = t0.elapsed();
    assert_eq!(soaked.steps_run, STEPS);

    // Same metrics, row for row (wall-clock times aside).
    assert_eq!(rows.len(), clean_rows.len());
    for (a, b) in rows.iter().zip(&clean_rows) {
        assert_eq!(a, b, "metrics differ from the fault-free run");
    }
    assert_eq!(
        soaked
            .last_step
            .as_ref()
            .map(|m| m.values.clone())
            .map(|mut v| {
                v.retain(|k, _| !k.starts_with("time/"));
                v
            }),
        clean
            .last_step
            .as_ref()
            .map(|m| m.values.clone())
            .map(|mut v| {
                v.retain(|k, _| !k.starts_with("time/"));
                v
            }),
    );

    let (injected, requests) = {
        let s = st.lock().unwrap();
        let c = clean_st.lock().unwrap();
        // Every optim_step applied exactly once, in seq_id order, the same ones as without faults
        // (one per step that had datums; all-degenerate steps train nothing).
        assert_eq!(
            s.optim_applied.len(),
            trained_steps(&rows),
            "{:?}",
            s.optim_applied
        );
        assert!(!s.optim_applied.is_empty());
        assert!(
            s.optim_applied.windows(2).all(|w| w[0] < w[1]),
            "{:?}",
            s.optim_applied
        );
        assert_eq!(s.optim_applied, c.optim_applied);
        assert_eq!(
            s.models["soak-session:train:0"].version,
            c.models["soak-session:train:0"].version
        );
        assert!(s.finished);
        // Every kind of fault happened, and retries of applied requests were answered from the
        // stores instead of being applied again.
        let total: usize = s.injected.values().sum();
        eprintln!(
            "soak: {} requests, {total} faults {:?}, {} replays by key, {} by seq_id, {elapsed:?}",
            s.requests, s.injected, s.replayed_by_key, s.replayed_by_seq
        );
        for f in [
            Fault::Status(500),
            Fault::Status(502),
            Fault::Status(503),
            Fault::TooMany,
            Fault::Status(408),
            Fault::ResetBefore,
            Fault::ResetAfter,
            Fault::SlowPoll,
            Fault::Truncated,
            Fault::Malformed,
        ] {
            assert!(s.injected.get(&f).copied().unwrap_or(0) > 0, "no {f:?}");
        }
        assert!(
            total * 100 >= s.requests * 5,
            "{total} of {} requests",
            s.requests
        );
        assert!(s.replayed_by_key > 0);
        (s.injected.clone(), s.requests)
    };

    // The same seed, the same faults: the fake is deterministic.
    let again_dir = tempfile::tempdir().unwrap();
    let (again, again_rows, again_st) = run(seed, rate, None, again_dir.path()).await;
    again.expect("the second run under faults finishes");
    assert_eq!(again_rows, rows);
    let a = again_st.lock().unwrap();
    assert_eq!(a.injected, injected);
    assert_eq!(a.requests, requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_that_must_not_be_retried_stop_the_run_after_writing_what_was_done() {
    for (fatal, endpoint) in [
        (
            Fatal {
                path: "optim_step",
                nth: 3,
                status: 400,
            },
            "optim_step",
        ),
        (
            Fatal {
                path: "asample",
                nth: 9,
                status: 401,
            },
            "asample",
        ),
        (
            Fatal {
                path: "forward_backward",
                nth: 5,
                status: 404,
            },
            "forward_backward",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let status = fatal.status;
        let (result, rows, st) = run(3, 0, Some(fatal.clone()), dir.path()).await;
        let err = result.expect_err("a fatal fault stops the run");
        match &err {
            Error::Http {
                status: s,
                endpoint: e,
                ..
            } => {
                assert_eq!(*s, status, "{err}");
                assert!(e.contains(endpoint), "{err} names {endpoint}");
            }
            other => panic!("{fatal:?}: expected Error::Http, got {other:?}"),
        }
        // The steps before the failing one are logged, each once and whole; the failing
        // step left no row.
        let s = st.lock().unwrap();
        let steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
        assert_eq!(
            steps,
            (0..rows.len() as u64).collect::<Vec<_>>(),
            "{fatal:?}"
        );
        assert!(
            rows.len() >= 3 && rows.len() < STEPS as usize,
            "{fatal:?}: {steps:?}"
        );
        // Every logged step's update reached the server; the failed step's did not.
        assert_eq!(s.optim_applied.len(), trained_steps(&rows), "{fatal:?}");
        assert_eq!(
            s.per_path[fatal.path],
            fatal.nth + 1,
            "not retried: {fatal:?}"
        );
    }
}
