//! Conformance with the official SDK's wire protocol: our client is driven through the same
//! calls as the recordings in `tests/fixtures/tinker-wire/` against an in-process server
//! that answers each request with the recorded response of the next exchange; then every
//! request we sent is compared with the recorded one (method, path, JSON bodies as parsed
//! values, protobuf bodies as decoded messages, and the headers with protocol meaning).
//!
//! Not replayed (no counterpart in our API): telemetry (optional for a client), the
//! session-level `retrieve_futures` polling of the variant (we poll `retrieve_future` per
//! request), `create_sampling_client(model_path)` + `GET samplers`, `compute_logprobs` on
//! that second sampler, the named `save_weights_for_sampler`, and the RestClient listing.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use prost::Message;
use rlvr::backend::tinker::proto;
use rlvr::backend::tinker::{TinkerBackendOptions, TinkerClient, TinkerConfig};
use rlvr::{
    PolicyBackend, Sampler,
    types::{
        AdamParams, Datum, LoraConfig, LossFn, ModelInput, SamplingParams, StopCondition,
        TensorData,
    },
};
use serde_json::Value;

const KEY: &str = "tml-capture-dummy-key-0000000000000000";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tinker-wire")
}

fn load(rel: &str) -> Value {
    let p = fixture_dir().join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

/// One recorded exchange, possibly adjusted where our call sequence differs (documented at
/// each use).
#[derive(Clone)]
struct Exchange {
    name: String,
    v: Value,
}

impl Exchange {
    fn new(rel: &str) -> Self {
        Exchange {
            name: rel.to_string(),
            v: load(rel),
        }
    }
    fn req(&self) -> &Value {
        &self.v["request"]
    }
    fn header(&self, name: &str) -> Option<String> {
        self.req()["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|h| {
                (h[0].as_str().unwrap().eq_ignore_ascii_case(name))
                    .then(|| h[1].as_str().unwrap().to_string())
            })
    }
    fn response(&self) -> Response {
        let r = &self.v["response"];
        let status = StatusCode::from_u16(r["status"].as_u64().unwrap() as u16).unwrap();
        let ct = r["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("content-type"))
            .map(|h| h[1].as_str().unwrap().to_string())
            .unwrap_or_else(|| "application/json".into());
        let body = if let Some(b) = r.get("body_b64").and_then(Value::as_str) {
            b64(b)
        } else {
            r.get("body_text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .as_bytes()
                .to_vec()
        };
        (status, [("content-type", ct)], body).into_response()
    }
}

#[derive(Debug, Clone)]
struct Got {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Got {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    }
}

struct Replay {
    queue: VecDeque<Exchange>,
    got: Vec<(Exchange, Got)>,
    heartbeat: Exchange,
    heartbeats: Vec<Got>,
    unexpected: Vec<String>,
}

async fn handle(
    State(st): State<Arc<Mutex<Replay>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let got = Got {
        method,
        path: uri.path().to_string(),
        headers,
        body: body.to_vec(),
    };
    let mut st = st.lock().unwrap();
    if got.path.ends_with("/session_heartbeat") {
        let resp = st.heartbeat.response();
        st.heartbeats.push(got);
        return resp;
    }
    match st.queue.pop_front() {
        Some(ex) => {
            let resp = ex.response();
            st.got.push((ex, got));
            resp
        }
        None => {
            st.unexpected.push(format!("{} {}", got.method, got.path));
            // 418: not retried by the client, so an unexpected request fails fast.
            (StatusCode::IM_A_TEAPOT, "no more recorded exchanges").into_response()
        }
    }
}

async fn serve(queue: Vec<Exchange>, heartbeat: Exchange) -> (String, Arc<Mutex<Replay>>) {
    let st = Arc::new(Mutex::new(Replay {
        queue: queue.into(),
        got: Vec::new(),
        heartbeat,
        heartbeats: Vec::new(),
        unexpected: Vec::new(),
    }));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(Arc::clone(&st));
    let addr = crate::common::serve(app).await;
    (format!("http://{addr}"), st)
}

/// An unsigned JWT like the recorded one, valid for an hour from now.
fn fresh_jwt() -> String {
    let enc = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!(
        "{}.{}.c2ln",
        enc(serde_json::json!({"alg": "none", "typ": "JWT"})),
        enc(
            serde_json::json!({"iss": "capture-server", "sub": "tml:user:capture", "iat": now, "exp": now + 3600})
        )
    )
}

fn test_tokenizer() -> rlvr::tokenizer::Tokenizer {
    let inner = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
    rlvr::tokenizer::Tokenizer::new(inner, None, Some(0))
}

/// The datums of a recorded forward_backward request, from its readable `body_decoded`.
fn datums_of(ex: &Exchange) -> (Vec<Datum>, String) {
    let dec = &ex.req()["body_decoded"];
    let data = dec["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let tokens: Vec<u32> = d["model_input"][0]["encoded_text"]["tokens_int32"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            let mut datum = Datum::new(ModelInput::from_tokens(tokens));
            for (name, t) in d["loss_fn_inputs"].as_object().unwrap() {
                let vals = t["dense_values"].as_array().unwrap();
                let tensor = if t["dtype"] == "DTYPE_INT64" {
                    TensorData::i64(vals.iter().map(|v| v.as_i64().unwrap()).collect())
                } else {
                    TensorData::f32(vals.iter().map(|v| v.as_f64().unwrap() as f32).collect())
                };
                datum = datum.with_input(name, tensor);
            }
            datum
        })
        .collect();
    (data, dec["loss_fn"].as_str().unwrap().to_string())
}

/// Headers whose values carry protocol meaning and must equal the recording's (absent in
/// both is fine).
const SEMANTIC_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-encoding",
    "x-stainless-retry-count",
    "x-tinker-request-iteration",
    "x-tinker-request-type",
    "x-tinker-sampling-backpressure",
    "x-stainless-raw-response",
    "x-sdk-version",
    "x-sdk-method",
];

fn compare(ex: &Exchange, got: &Got, credential: &str) {
    let ctx = &ex.name;
    let req = ex.req();
    assert_eq!(
        got.method.as_str(),
        req["method"].as_str().unwrap(),
        "{ctx}: method"
    );
    assert_eq!(got.path, req["path"].as_str().unwrap(), "{ctx}: path");

    for h in SEMANTIC_HEADERS {
        assert_eq!(got.header(h), ex.header(h), "{ctx}: header {h}");
    }
    let timeout = |s: Option<String>| s.map(|v| v.parse::<f64>().unwrap());
    assert_eq!(
        timeout(got.header("x-stainless-read-timeout")),
        timeout(ex.header("x-stainless-read-timeout")),
        "{ctx}: read timeout"
    );
    match ex.header("x-idempotency-key") {
        Some(_) => {
            let k = got
                .header("x-idempotency-key")
                .unwrap_or_else(|| panic!("{ctx}: no idempotency key"));
            let id = k
                .strip_prefix("stainless-python-retry-")
                .and_then(|u| uuid::Uuid::parse_str(u).ok())
                .unwrap_or_else(|| panic!("{ctx}: key {k}"));
            // A random (version 4, RFC 4122) UUID, as the SDK's `uuid.uuid4()`.
            assert_eq!(id.get_version_num(), 4, "{ctx}: key {k}");
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122, "{ctx}: key {k}");
        }
        None => assert!(
            got.header("x-idempotency-key").is_none(),
            "{ctx}: unexpected idempotency key"
        ),
    }
    match ex.header("x-tinker-create-promise-roundtrip-time") {
        Some(_) => {
            let v: f64 = got
                .header("x-tinker-create-promise-roundtrip-time")
                .unwrap_or_else(|| panic!("{ctx}: no roundtrip time"))
                .parse()
                .unwrap();
            assert!(v >= 0.0);
        }
        None => assert!(
            got.header("x-tinker-create-promise-roundtrip-time")
                .is_none(),
            "{ctx}"
        ),
    }
    assert_eq!(
        got.header("x-api-key").as_deref(),
        Some(credential),
        "{ctx}: credential"
    );

    if let Some(expected) = req.get("body_json").filter(|v| !v.is_null()) {
        let ours: Value = serde_json::from_slice(&got.body).unwrap_or_else(|e| {
            panic!(
                "{ctx}: our body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&got.body)
            )
        });
        assert_eq!(&ours, expected, "{ctx}: JSON body");
    } else if let Some(b) = req.get("body_b64").and_then(Value::as_str) {
        let expected_bytes = match req.get("body_zstd_b64").and_then(Value::as_str) {
            Some(z) => zstd::decode_all(b64(z).as_slice()).unwrap(),
            None => b64(b),
        };
        let ours_bytes = if got.header("content-encoding").as_deref() == Some("zstd") {
            zstd::decode_all(got.body.as_slice()).unwrap()
        } else {
            got.body.clone()
        };
        let mut expected =
            proto::ForwardBackwardRequest::decode(expected_bytes.as_slice()).unwrap();
        if let Some(seq) = req.get("patched_seq_id").and_then(Value::as_i64) {
            expected.seq_id = seq as i32;
        }
        let ours = proto::ForwardBackwardRequest::decode(ours_bytes.as_slice()).unwrap();
        assert_eq!(ours, expected, "{ctx}: protobuf body");
    } else {
        assert!(got.body.is_empty(), "{ctx}: unexpected body");
    }
}

fn assert_all_consumed(st: &Replay) {
    assert!(
        st.unexpected.is_empty(),
        "unexpected requests: {:?}",
        st.unexpected
    );
    let left: Vec<&str> = st.queue.iter().map(|e| e.name.as_str()).collect();
    assert!(
        left.is_empty(),
        "recorded exchanges never requested: {left:?}"
    );
}

async fn wait_for_heartbeat(st: &Arc<Mutex<Replay>>) {
    for _ in 0..200 {
        if !st.lock().unwrap().heartbeats.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no heartbeat was sent");
}

fn check_heartbeats(st: &Replay, credential: &str) {
    for hb in &st.heartbeats {
        compare(&st.heartbeat, hb, credential);
    }
}

#[tokio::test]
async fn basic_flow_matches_the_sdk_recording() {
    let names = [
        "01-client_config.json",
        "02-client_dynamic_config.json",
        "03-get_server_capabilities.json",
        "04-client_config.json",
        "05-client_dynamic_config.json",
        "06-create_session.json",
        "07-create_model.json",
        "08-retrieve_future-CreateModel.json",
        "09-retrieve_future-CreateModel.json",
        "10-get_info.json",
        "11-forward_backward.json",
        "12-optim_step.json",
        "13-retrieve_future-ForwardBackward.json",
        "14-retrieve_future-ForwardBackward.json",
        "15-retrieve_future-OptimStep.json",
        "16-save_weights_for_sampler.json",
        "17-retrieve_future-SaveWeightsForSampler.json",
        "18-asample.json",
        "19-retrieve_future-Sample.json",
        "20-retrieve_future-Sample.json",
        // 21 (heartbeat) is answered out of band; 22 (telemetry) is not sent by us.
        "23-sessions_finish.json",
    ];
    let queue: Vec<Exchange> = names.iter().map(|n| Exchange::new(n)).collect();
    let (url, st) = serve(queue.clone(), Exchange::new("21-session_heartbeat.json")).await;
    let results = load("sdk_results.json");

    let config = TinkerConfig::new(KEY)
        .unwrap()
        .base_url(&url)
        .heartbeat_interval(Duration::from_millis(200));
    let caps = TinkerClient::get_server_capabilities(&config)
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&caps).unwrap(),
        results["get_server_capabilities"]["supported_models"]
    );

    let client = TinkerClient::connect(config).await.unwrap();
    assert_eq!(client.session_id(), "capture-session-0001");
    let opts = TinkerBackendOptions {
        tokenizer: Some(test_tokenizer()),
    };
    let backend = client
        .create_lora_training_with("Qwen/Qwen3-8B", LoraConfig::new(32), opts)
        .await
        .unwrap();
    assert_eq!(backend.model_id().await, "capture-session-0001:train:0");
    assert_eq!(
        serde_json::to_value(backend.info()).unwrap()["model_data"],
        results["training_client"]["get_info"]["model_data"]
    );

    let (data, loss) = datums_of(&queue[10]);
    assert_eq!(loss, "importance_sampling");
    let fb = backend
        .forward_backward(data, LossFn::ImportanceSampling)
        .await
        .unwrap();
    // optim_step goes out before the forward_backward result is fetched.
    let opt = backend
        .optim_step(AdamParams {
            learning_rate: 4e-5,
            ..AdamParams::default()
        })
        .await
        .unwrap();
    let fb = fb.await.unwrap();
    let expected_fb = &results["forward_backward"];
    assert_eq!(fb.loss_fn_output_type, "ArrayRecord");
    assert_eq!(fb.metrics["loss:sum"], -12.375);
    assert_eq!(fb.loss_fn_outputs.len(), 2);
    for (i, out) in fb.loss_fn_outputs.iter().enumerate() {
        let exp = &expected_fb["loss_fn_outputs"][i]["logprobs"];
        let lp = &out["logprobs"];
        let want: Vec<f32> = exp["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(lp.as_f32().unwrap(), want.as_slice());
        assert_eq!(lp.shape(), &[want.len()]);
    }
    let opt = opt.await.unwrap();
    assert_eq!(
        serde_json::to_value(&opt.metrics).unwrap(),
        results["optim_step"]["metrics"]
    );

    let sampler = backend.sampler().await.unwrap();
    assert_eq!(
        sampler.sampling_session_id(),
        "capture-session-0001:sample:0"
    );
    let prompt = ModelInput::from_tokens(vec![
        151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198,
    ]);
    let params = SamplingParams::default()
        .max_tokens(16)
        .stop(StopCondition::Strings(vec!["\n\nUser:".into()]));
    let seqs = sampler.sample(&prompt, 4, &params).await.unwrap();
    let want = results["sample"]["sequences"].as_array().unwrap();
    assert_eq!(seqs.len(), want.len());
    for (s, w) in seqs.iter().zip(want) {
        assert_eq!(s.sequence_id.as_deref(), w["sequence_id"].as_str());
        assert_eq!(
            serde_json::to_value(s.stop_reason).unwrap(),
            w["stop_reason"]
        );
        let toks: Vec<u32> = w["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(s.tokens, toks);
        let lps: Vec<f32> = w["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(s.logprobs, lps);
    }

    wait_for_heartbeat(&st).await;
    client.close().await.unwrap();
    drop((backend, sampler));

    let st = st.lock().unwrap();
    assert_all_consumed(&st);
    for (ex, got) in &st.got {
        compare(ex, got, KEY);
    }
    check_heartbeats(&st, KEY);
    // One idempotency key per call.
    let mut keys: Vec<String> = st
        .got
        .iter()
        .filter_map(|(_, g)| g.header("x-idempotency-key"))
        .collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(
        keys.len(),
        n,
        "idempotency keys are not reused across calls"
    );
}

#[tokio::test]
async fn variant_flow_jwt_zstd_retries_backpressure_metadata() {
    let mut queue = Vec::new();
    // The recorded JWT has expired by now (the client would refresh it before every
    // request): answer the exchange with the same claims and a fresh expiry.
    let jwt = fresh_jwt();
    for n in [
        "05-client_config.json", // pjwt + zstd on
        "06-auth_token.json",    // JWT exchange with the raw key
        "07-client_dynamic_config.json",
        "08-create_session.json",
        "09-create_model.json",
        "10-retrieve_future-CreateModel.json",
        "11-get_info.json",         // 503
        "12-get_info.json",         // HTTP-layer retry: same idempotency key, retry count 1
        "13-forward_backward.json", // zstd body
        "14-optim_step.json",
        "15-retrieve_future-ForwardBackward.json", // 408: poll again
        "16-retrieve_future-ForwardBackward.json",
        "17-retrieve_future-OptimStep.json", // complete_metadata
        "18-retrieve_future-OptimStep.json", // allow_metadata_only false
        "19-save_weights_for_sampler.json",
        "20-retrieve_future-SaveWeightsForSampler.json",
        "21-asample.json", // 429: back-pressure
        "22-asample.json", // same seq_id, new idempotency key
    ] {
        let mut ex = Exchange::new(&format!("variant/{n}"));
        if n.starts_with("06-") {
            let body = serde_json::json!({ "jwt": jwt });
            ex.v["response"]["body_text"] = Value::String(body.to_string());
            ex.v["response"]["body_json"] = body;
        }
        queue.push(ex);
    }
    // The SDK learned of the sample's completion through `retrieve_futures` (23-24), so its
    // single poll asked for the full payload; we long-poll directly (allow_metadata_only
    // true, as in the basic recording).
    let mut ex = Exchange::new("variant/25-retrieve_future-Sample.json");
    ex.v["request"]["body_json"]["allow_metadata_only"] = Value::Bool(true);
    queue.push(ex);
    // save_state: the SDK call also passed ttl_seconds and user_metadata, which our
    // `save_state(name)` does not send.
    let mut ex = Exchange::new("variant/26-save_weights.json");
    let body = ex.v["request"]["body_json"].as_object_mut().unwrap();
    body.remove("ttl_seconds");
    body.remove("user_metadata");
    queue.push(ex);
    queue.push(Exchange::new("variant/27-retrieve_future-SaveWeights.json"));
    // forward (ppo, loss_fn_config, zstd): seq 5 here, 6 in the recording (we skip the
    // named save_weights_for_sampler, 29).
    let mut ex = Exchange::new("variant/37-forward_backward.json");
    ex.v["request"]["patched_seq_id"] = Value::from(5);
    queue.push(ex);
    queue.push(Exchange::new("variant/38-retrieve_future-Forward.json")); // 408
    queue.push(Exchange::new("variant/40-retrieve_future-Forward.json"));
    queue.push(Exchange::new("variant/47-sessions_finish.json"));

    let heartbeat = Exchange::new("variant/45-session_heartbeat.json");
    let (url, st) = serve(queue.clone(), heartbeat).await;

    let config = TinkerConfig::new(KEY)
        .unwrap()
        .base_url(&url)
        .heartbeat_interval(Duration::from_millis(200));
    let client = TinkerClient::connect(config).await.unwrap();
    let opts = TinkerBackendOptions {
        tokenizer: Some(test_tokenizer()),
    };
    let backend = client
        .create_lora_training_with("Qwen/Qwen3-8B", LoraConfig::new(32), opts)
        .await
        .unwrap();
    let (data, _) = datums_of(&queue[8]);
    let fb = backend
        .forward_backward(data, LossFn::ImportanceSampling)
        .await
        .unwrap();
    let opt = backend
        .optim_step(AdamParams {
            learning_rate: 4e-5,
            ..AdamParams::default()
        })
        .await
        .unwrap();
    let fb = fb.await.unwrap();
    assert_eq!(fb.loss_fn_outputs.len(), 2);
    let opt = opt.await.unwrap();
    assert_eq!(opt.metrics["grad_norm:mean"], 0.5);

    let sampler = backend.sampler().await.unwrap();
    let prompt = ModelInput::from_tokens(vec![
        151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198,
    ]);
    let params = SamplingParams::default()
        .max_tokens(16)
        .stop(StopCondition::Strings(vec!["\n\nUser:".into()]));
    let seqs = sampler.sample(&prompt, 4, &params).await.unwrap();
    assert_eq!(seqs.len(), 4);

    let ckpt = backend.save_state("ckpt-1").await.unwrap();
    assert_eq!(
        ckpt.path,
        "tinker://capture-session-0001:train:0/weights/ckpt-1"
    );

    let fwd_ex = queue.iter().find(|e| e.name.contains("37-")).unwrap();
    let (data, loss) = datums_of(fwd_ex);
    assert_eq!(loss, "ppo");
    let out = backend
        .forward(data, LossFn::ppo())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(out.loss_fn_outputs.len(), 1);

    wait_for_heartbeat(&st).await;
    client.close().await.unwrap();
    drop((backend, sampler));

    let st = st.lock().unwrap();
    assert_all_consumed(&st);
    for (ex, got) in &st.got {
        let raw_key = ex.name.contains("client_config") || ex.name.contains("auth_token");
        compare(ex, got, if raw_key { KEY } else { &jwt });
    }
    check_heartbeats(&st, &jwt);
    let key_of = |file: &str| {
        st.got
            .iter()
            .find(|(e, _)| e.name.ends_with(file))
            .and_then(|(_, g)| g.header("x-idempotency-key"))
            .unwrap()
    };
    assert_eq!(
        key_of("11-get_info.json"),
        key_of("12-get_info.json"),
        "same key across an HTTP retry"
    );
    assert_ne!(
        key_of("21-asample.json"),
        key_of("22-asample.json"),
        "new key for the back-pressure resend"
    );
}

/// The data of `tests/fixtures/tinker-wire/custom_loss/capture.py` (`DATA_SPEC`): three
/// datums of lengths 5, 7 and 3 as the trainer builds them; the third also has `weights`.
fn custom_loss_data() -> Vec<Datum> {
    type Spec<'a> = (
        &'a [u32],
        &'a [i64],
        &'a [f32],
        &'a [f32],
        Option<&'a [f32]>,
    );
    let specs: [Spec; 3] = [
        (
            &[151644, 872, 198, 9707, 11],
            &[872, 198, 9707, 11, 1879],
            &[0.0, 0.0, -1.25, -0.5, -2.0],
            &[0.0, 0.0, 1.0, 1.0, 1.0],
            None,
        ),
        (
            &[151644, 872, 198, 3838, 374, 279, 4226],
            &[872, 198, 3838, 374, 279, 4226, 151645],
            &[0.0, 0.0, 0.0, -0.125, -3.5, -1.0, -0.3],
            &[0.0, 0.0, 0.0, -0.5, -0.5, -0.5, -0.5],
            None,
        ),
        (
            &[151644, 9707, 11],
            &[9707, 11, 0],
            &[0.0, -0.7, -1.1],
            &[0.0, 0.3333, 0.3333],
            Some(&[0.0, 1.0, 1.0]),
        ),
    ];
    specs
        .iter()
        .map(|(tokens, targets, q, adv, w)| {
            let d = Datum::new(ModelInput::from_tokens(tokens.to_vec()))
                .with_target_tokens(targets.to_vec())
                .with_logprobs(q.to_vec())
                .with_advantages(adv.to_vec());
            match w {
                Some(w) => d.with_weights(w.to_vec()),
                None => d,
            }
        })
        .collect()
}

/// `rlvr::loss::forward_backward_custom` with `ImportanceSamplingLoss` sends what the SDK's
/// `forward_backward_custom` sent with the same loss written in torch
/// (`custom_loss/client/`): the forward pass (seq 1, `cross_entropy`, forward only, each
/// datum's `target_tokens` and its `weights` or zeros), then the backward pass (seq 2,
/// `cross_entropy`, `weights = −∂loss/∂logprobs`), both and their polls under `X-SDK-Method:
/// TrainingClient.forward_backward_custom`; the next request (optim_step) takes seq 3. The
/// bodies are compared as decoded protobuf messages, the gradient weights bit for bit.
#[tokio::test]
async fn forward_backward_custom_matches_the_sdk_recording() {
    use rlvr::loss::{ImportanceSamplingLoss, forward_backward_custom};
    let names = [
        "01-client_config.json",
        "02-client_dynamic_config.json",
        "03-create_session.json",
        "04-create_model.json",
        "05-retrieve_future-CreateModel.json",
        "06-get_info.json",
        "07-forward_backward.json",
        "08-retrieve_future-Forward.json",
        "09-forward_backward.json",
        "10-retrieve_future-ForwardBackward.json",
        "11-optim_step.json",
        "12-retrieve_future-OptimStep.json",
        "13-sessions_finish.json",
    ];
    let queue: Vec<Exchange> = names
        .iter()
        .map(|n| Exchange::new(&format!("custom_loss/client/{n}")))
        .collect();
    let (url, st) = serve(queue, Exchange::new("21-session_heartbeat.json")).await;
    let results = load("custom_loss/results.json");

    let config = TinkerConfig::new(KEY).unwrap().base_url(&url);
    let client = TinkerClient::connect(config).await.unwrap();
    let opts = TinkerBackendOptions {
        tokenizer: Some(test_tokenizer()),
    };
    let backend = client
        .create_lora_training_with("Qwen/Qwen3-8B", LoraConfig::new(32), opts)
        .await
        .unwrap();
    let out = forward_backward_custom(&backend, custom_loss_data(), &ImportanceSamplingLoss)
        .await
        .unwrap();
    let want = &results["client"]["metrics"];
    // The SDK sums the loss in float32 (torch), we in float64.
    let loss = want["loss:sum"].as_f64().unwrap();
    assert!(
        (out.metrics["loss:sum"] - loss).abs() <= 1e-6 * loss.abs(),
        "{} vs {loss}",
        out.metrics["loss:sum"]
    );
    assert_eq!(
        out.metrics["surrogate_loss:sum"],
        want["surrogate_loss:sum"].as_f64().unwrap()
    );
    backend
        .optim_step(AdamParams {
            learning_rate: 4e-5,
            ..AdamParams::default()
        })
        .await
        .unwrap()
        .await
        .unwrap();
    client.close().await.unwrap();
    drop(backend);

    let st = st.lock().unwrap();
    assert_all_consumed(&st);
    let mut off_by_one_ulp = 0;
    for (ex, got) in &st.got {
        if ex.name.ends_with("09-forward_backward.json") {
            let (ex, n) = with_our_weights_within_one_ulp(ex, got);
            off_by_one_ulp = n;
            compare(&ex, got, KEY);
        } else {
            compare(ex, got, KEY);
        }
    }
    // One of the 15 weights: torch rounds `lp − lp_sampler` to float32 before `exp`, we
    // round once at the end.
    assert_eq!(off_by_one_ulp, 1);
    check_heartbeats(&st, KEY);
}

/// `ex` with its backward pass's gradient weights replaced by ours, after checking that each
/// is within one float32 ulp of the SDK's; also the number that differ at all.
fn with_our_weights_within_one_ulp(ex: &Exchange, got: &Got) -> (Exchange, usize) {
    let req = ex.req();
    let mut expected =
        proto::ForwardBackwardRequest::decode(b64(req["body_b64"].as_str().unwrap()).as_slice())
            .unwrap();
    let ours = proto::ForwardBackwardRequest::decode(got.body.as_slice()).unwrap();
    assert_eq!(ours.data.len(), expected.data.len());
    let f32s = |t: &proto::Tensor| -> Vec<u32> {
        match &t.encoding {
            Some(proto::tensor::Encoding::Dense(b)) => b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => panic!("not dense: {other:?}"),
        }
    };
    let mut differ = 0;
    for (i, (e, o)) in expected.data.iter_mut().zip(&ours.data).enumerate() {
        let (ew, ow) = (&e.loss_fn_inputs["weights"], &o.loss_fn_inputs["weights"]);
        let (eb, ob) = (f32s(ew), f32s(ow));
        assert_eq!(eb.len(), ob.len(), "datum {i}");
        for (t, (x, y)) in eb.iter().zip(&ob).enumerate() {
            // Same sign, adjacent or equal bit patterns.
            assert!(
                x >> 31 == y >> 31 && x.abs_diff(*y) <= 1,
                "datum {i} weight {t}: {} vs {}",
                f32::from_bits(*x),
                f32::from_bits(*y)
            );
            differ += usize::from(x != y);
        }
        e.loss_fn_inputs.insert("weights".into(), ow.clone());
    }
    let mut ex = ex.clone();
    ex.v["request"]["body_b64"] =
        Value::String(base64::engine::general_purpose::STANDARD.encode(expected.encode_to_vec()));
    (ex, differ)
}
