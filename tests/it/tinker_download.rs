//! Downloading weights from Tinker (`rlvr::backend::tinker::download_weights`), as
//! tinker-cookbook 0.6.1's `weights.download`:
//!
//! * against an in-process fake service that serves the REST endpoints and the signed-URL
//!   file bodies, with faults injected (a connection dropped mid-file, a 5xx, an expired
//!   URL, a file whose size changes, a wrong digest, a traversal name, an unknown run, a
//!   wrong age key, an unwritable output directory);
//! * against the recorded requests of the real SDK/cookbook
//!   (`tests/fixtures/tinker-wire/weights/`, made by `capture.py` there): the same calls,
//!   compared request by request.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures::StreamExt;
use md5::Digest as _;
use rlvr::backend::tinker::{DownloadOptions, TinkerConfig, download_weights};
use rlvr::{Error, WeightsDownloadErrorKind as Kind};
use serde_json::{Value, json};

const KEY: &str = "tml-capture-dummy-key-0000000000000000";
const RUN: &str = "run-7";
const SESSION: &str = "s-1";

/// A fault for the next request of one file.
#[derive(Clone, Debug)]
enum Fault {
    /// Sends the headers of the whole answer and this many bytes, then drops the connection.
    DropAfter(usize),
    /// Answers this status with no body.
    Status(u16),
    /// Refuses the signature as expired (403, as S3), whatever it is.
    Expired,
    /// Refuses the signature as expired (400 `ExpiredToken`, as Google Cloud Storage).
    ExpiredToken,
    /// Answers a range request with the whole file (200).
    IgnoreRange,
    /// Answers a range request for a file of another size (the file changed).
    OtherTotal,
    /// Announces a wrong MD5 digest.
    BadDigest,
}

#[derive(Default)]
struct Fake {
    base: String,
    /// The checkpoint's files (plaintext), by name.
    files: BTreeMap<String, Vec<u8>>,
    /// Served files (encrypted for an encrypted export), by served name.
    served: BTreeMap<String, Vec<u8>>,
    faults: HashMap<String, VecDeque<Fault>>,
    /// Every request: method, path, query, headers.
    log: Vec<(String, String, String, HeaderMap, Vec<u8>)>,
    signs: u32,
    /// Seconds from now to the URLs' expiry.
    expires_in: i64,
    /// The export's recipients (`save_weights_external`), or an override (wrong key test).
    encrypt_to: Option<String>,
    override_recipient: Option<String>,
    /// Encrypts the files of an external export (a user's own recipient).
    exported: bool,
    deleted: Vec<String>,
    finished: Vec<Value>,
}

type Shared = Arc<Mutex<Fake>>;

fn md5_b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(b))
}

fn age_encrypt(data: &[u8], recipient: &str) -> Vec<u8> {
    let r: age::x25519::Recipient = recipient.parse().unwrap();
    let enc = age::Encryptor::with_recipients(std::iter::once(&r as &dyn age::Recipient)).unwrap();
    let mut out = Vec::new();
    let mut w = enc.wrap_output(&mut out).unwrap();
    w.write_all(data).unwrap();
    w.finish().unwrap();
    out
}

fn json_resp(v: Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn handle(
    State(st): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or("").to_string();
    let mut f = st.lock().unwrap();
    f.log.push((
        method.to_string(),
        path.clone(),
        query.clone(),
        headers.clone(),
        body.to_vec(),
    ));
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Some(name) = path.strip_prefix("/storage/") {
        return storage(&mut f, name, &query, &headers);
    }
    let p = path.trim_start_matches("/api/v1/");
    match (method.as_str(), p) {
        ("POST", "client/config") => json_resp(json!({"pjwt_auth_enabled": false})),
        ("POST", "client/dynamic_config") => json_resp(json!({})),
        ("POST", "create_session") => json_resp(json!({"session_id": SESSION})),
        ("POST", "session_heartbeat") => json_resp(json!({})),
        ("POST", "load_weights") => {
            if !req["path"]
                .as_str()
                .unwrap_or("")
                .starts_with(&format!("tinker://{RUN}/"))
            {
                return (StatusCode::NOT_FOUND, "no such checkpoint").into_response();
            }
            json_resp(json!({"request_id": "r-load", "model_id": format!("{SESSION}:train:0")}))
        }
        ("POST", "get_info") => json_resp(json!({
            "model_id": format!("{SESSION}:train:0"),
            "model_data": {"model_name": "Qwen/Qwen3-8B"},
            "is_lora": true, "lora_rank": 32
        })),
        ("POST", "save_weights_external") => {
            let r = req["age_encryption_recipients"][0]
                .as_str()
                .map(str::to_string);
            f.encrypt_to = f.override_recipient.clone().or(r);
            json_resp(json!({"request_id": "r-export", "model_id": format!("{SESSION}:train:0")}))
        }
        ("POST", "retrieve_future") => match req["request_id"].as_str() {
            Some("r-load") => {
                json_resp(json!({"type": "load_weights", "model_id": format!("{SESSION}:train:0")}))
            }
            Some("r-export") => {
                f.exported = true;
                json_resp(json!({"type": "save_weights_external",
                                 "path": format!("tinker://{SESSION}:train:0/external_weights/download")}))
            }
            _ => (StatusCode::NOT_FOUND, "unknown future").into_response(),
        },
        ("POST", p) if p.starts_with("sessions/") && p.ends_with("/finish") => {
            f.finished.push(req);
            json_resp(json!({}))
        }
        ("GET", p) if p.ends_with("/external_weights_urls") => {
            let known = p.starts_with(&format!("training_runs/{RUN}/"))
                || (f.exported && p.starts_with(&format!("training_runs/{SESSION}:train:0/")));
            if !known {
                return (StatusCode::NOT_FOUND, r#"{"detail":"run not found"}"#).into_response();
            }
            f.signs += 1;
            let sig = f.signs;
            // Serve the files (encrypted to the export's recipient when there is one).
            let served: BTreeMap<String, Vec<u8>> = match (&f.encrypt_to, f.exported) {
                (Some(r), true) => f
                    .files
                    .iter()
                    .map(|(k, v)| (format!("{k}.age"), age_encrypt(v, r)))
                    .collect(),
                _ => f.files.clone(),
            };
            if f.served.is_empty() || f.served.keys().ne(served.keys()) {
                f.served = served;
            }
            let urls: BTreeMap<String, String> = f
                .served
                .keys()
                .map(|k| (k.clone(), format!("{}/storage/{k}?sig=s{sig}", f.base)))
                .collect();
            let expires = std::time::SystemTime::now()
                .checked_add(std::time::Duration::from_secs(f.expires_in.max(0) as u64))
                .unwrap();
            json_resp(json!({"urls": urls, "expires": rfc3339(expires)}))
        }
        ("PUT", p) if p.ends_with("/ttl") => json_resp(json!({})),
        ("DELETE", p) if p.starts_with("training_runs/") => {
            f.deleted.push(p.to_string());
            json_resp(json!({}))
        }
        _ => (
            StatusCode::IM_A_TEAPOT,
            format!("unexpected {method} {path}"),
        )
            .into_response(),
    }
}

fn rfc3339(t: std::time::SystemTime) -> String {
    let s = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (s.div_euclid(86_400), s.rem_euclid(86_400));
    // Civil date from days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.123456Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn storage(f: &mut Fake, name: &str, query: &str, headers: &HeaderMap) -> Response {
    let fault = f.faults.get_mut(name).and_then(VecDeque::pop_front);
    let current = format!("sig=s{}", f.signs);
    if matches!(fault, Some(Fault::Expired)) || query != current {
        return (StatusCode::FORBIDDEN, "Request has expired").into_response();
    }
    if matches!(fault, Some(Fault::ExpiredToken)) {
        return (
            StatusCode::BAD_REQUEST,
            "<Error><Code>ExpiredToken</Code></Error>",
        )
            .into_response();
    }
    let Some(data) = f.served.get(name).cloned() else {
        return (StatusCode::NOT_FOUND, "no such object").into_response();
    };
    if let Some(Fault::Status(s)) = fault {
        return StatusCode::from_u16(s).unwrap().into_response();
    }
    let start: usize = headers
        .get("range")
        .filter(|_| !matches!(fault, Some(Fault::IgnoreRange)))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.strip_suffix('-'))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let digest = match fault {
        Some(Fault::BadDigest) => md5_b64(b"something else"),
        _ => md5_b64(&data),
    };
    let total = match fault {
        Some(Fault::OtherTotal) => data.len() + 1,
        _ => data.len(),
    };
    let rest = data[start.min(data.len())..].to_vec();
    let mut builder = Response::builder()
        .header("content-type", "application/octet-stream")
        .header("x-goog-hash", format!("crc32c=AAAAAA==,md5={digest}"))
        .header("content-length", rest.len().to_string());
    builder = if start > 0 {
        builder.status(206).header(
            "content-range",
            format!("bytes {start}-{}/{total}", data.len() - 1),
        )
    } else {
        builder.status(200)
    };
    let body = match fault {
        Some(Fault::DropAfter(n)) => {
            let head = Bytes::from(rest[..n.min(rest.len())].to_vec());
            // The bytes first (given time to arrive), then the connection drops.
            let stream = futures::stream::iter(vec![
                Ok::<_, std::io::Error>(head),
                Err(std::io::Error::other("connection dropped")),
            ])
            .then(|item| async move {
                if item.is_err() {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                item
            });
            Body::from_stream(stream)
        }
        _ => Body::from(rest),
    };
    builder.body(body).unwrap()
}

fn files() -> BTreeMap<String, Vec<u8>> {
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    BTreeMap::from([
        ("adapter_config.json".to_string(), br#"{"r": 32}"#.to_vec()),
        ("adapter_model.safetensors".to_string(), big),
    ])
}

async fn start(setup: impl FnOnce(&mut Fake)) -> (TinkerConfig, Shared) {
    let st: Shared = Arc::new(Mutex::new(Fake {
        files: files(),
        expires_in: 3600,
        ..Fake::default()
    }));
    setup(&mut st.lock().unwrap());
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(Arc::clone(&st));
    let addr = crate::common::serve(app).await;
    st.lock().unwrap().base = format!("http://{addr}");
    let config = TinkerConfig::new(KEY)
        .unwrap()
        .base_url(format!("http://{addr}"))
        .backoff_scale(0.01);
    (config, st)
}

fn opts() -> DownloadOptions {
    DownloadOptions::new().progress(false)
}

fn external() -> String {
    format!("tinker://{RUN}/external_weights/final")
}

/// The files in `dir` (recursively, hidden ones included), relative.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.push(format!("{}/", p.strip_prefix(base).unwrap().display()));
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn assert_files(dir: &Path) {
    let names: Vec<String> = files().keys().cloned().collect();
    assert_eq!(listing(dir), names, "{}", dir.display());
    for (name, data) in files() {
        assert_eq!(std::fs::read(dir.join(&name)).unwrap(), data, "{name}");
    }
}

fn kind_of(e: &Error) -> Kind {
    match e {
        Error::WeightsDownload { kind, .. } => *kind,
        other => panic!("not a download error: {other:?}"),
    }
}

fn storage_requests(st: &Shared, name: &str) -> Vec<(String, Option<String>)> {
    st.lock()
        .unwrap()
        .log
        .iter()
        .filter(|(_, p, ..)| p == &format!("/storage/{name}"))
        .map(|(_, _, q, h, _)| {
            (
                q.clone(),
                h.get("range").map(|v| v.to_str().unwrap().to_string()),
            )
        })
        .collect()
}

#[tokio::test]
async fn external_weights_download_into_place() {
    let (config, st) = start(|_| {}).await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("adapter");
    let got = download_weights(&config, &external(), &out, &opts())
        .await
        .unwrap();
    assert_eq!(got, out);
    assert_files(&out);
    let f = st.lock().unwrap();
    assert_eq!(f.signs, 1);
    // No session for an export: the REST client only fetches its config.
    let api: Vec<&str> = f.log.iter().map(|(_, p, ..)| p.as_str()).collect();
    assert!(!api.iter().any(|p| p.contains("create_session")), "{api:?}");
    // The service's key never goes to the storage.
    for (_, p, _, h, _) in &f.log {
        if p.starts_with("/storage/") {
            assert!(h.get("x-api-key").is_none());
        }
    }
}

#[tokio::test]
async fn a_dropped_connection_resumes_with_a_range_request() {
    let (config, st) = start(|f| {
        f.faults.insert(
            "adapter_model.safetensors".into(),
            VecDeque::from([Fault::DropAfter(65_536), Fault::DropAfter(30_000)]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap();
    assert_files(tmp.path());
    let reqs = storage_requests(&st, "adapter_model.safetensors");
    assert_eq!(reqs.len(), 3, "{reqs:?}");
    assert_eq!(reqs[0].1, None);
    // Resumed where the data stopped (what arrived before the drop, at least the first chunk).
    let r1 = reqs[1].1.clone().unwrap();
    let r2 = reqs[2].1.clone().unwrap();
    let at = |r: &str| -> usize {
        r.trim_start_matches("bytes=")
            .trim_end_matches('-')
            .parse()
            .unwrap()
    };
    assert!(at(&r1) > 0 && at(&r1) <= 65_536, "{r1}");
    assert!(at(&r2) > at(&r1), "{r1} then {r2}");
}

#[tokio::test]
async fn a_server_error_is_retried() {
    let (config, st) = start(|f| {
        f.faults.insert(
            "adapter_config.json".into(),
            VecDeque::from([Fault::Status(503), Fault::Status(500)]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap();
    assert_files(tmp.path());
    assert_eq!(storage_requests(&st, "adapter_config.json").len(), 3);
}

#[tokio::test]
async fn retries_run_out_and_nothing_is_left() {
    let (config, _st) = start(|f| {
        f.faults.insert(
            "adapter_model.safetensors".into(),
            VecDeque::from(vec![Fault::Status(502); 10]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let e = download_weights(&config, &external(), &out, &opts().max_retries(2))
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::Transfer, "{e}");
    assert!(e.to_string().contains("adapter_model.safetensors"), "{e}");
    assert!(!out.exists(), "{:?}", listing(&out));
}

#[tokio::test]
async fn an_expired_url_is_signed_again() {
    let (config, st) = start(|f| {
        f.faults.insert(
            "adapter_model.safetensors".into(),
            VecDeque::from([Fault::Expired]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap();
    assert_files(tmp.path());
    assert_eq!(st.lock().unwrap().signs, 2);
    let reqs = storage_requests(&st, "adapter_model.safetensors");
    assert_eq!(
        reqs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["sig=s1", "sig=s2"]
    );
}

#[tokio::test]
async fn an_expired_token_answer_is_signed_again() {
    let (config, st) = start(|f| {
        f.faults.insert(
            "adapter_config.json".into(),
            VecDeque::from([Fault::ExpiredToken]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap();
    assert_files(tmp.path());
    assert_eq!(st.lock().unwrap().signs, 2);
}

#[tokio::test]
async fn a_storage_without_ranges_restarts_the_file() {
    let (config, st) = start(|f| {
        f.faults.insert(
            "adapter_model.safetensors".into(),
            VecDeque::from([Fault::DropAfter(50_000), Fault::IgnoreRange]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap();
    assert_files(tmp.path());
    let reqs = storage_requests(&st, "adapter_model.safetensors");
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert!(reqs[1].1.is_some(), "{reqs:?}");
}

#[tokio::test]
async fn urls_about_to_expire_are_signed_before_each_file() {
    let (config, st) = start(|f| f.expires_in = 60).await;
    let tmp = tempfile::tempdir().unwrap();
    download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap();
    assert_files(tmp.path());
    // Once at the start, then before each of the two files (as the cookbook).
    assert_eq!(st.lock().unwrap().signs, 3);
}

#[tokio::test]
async fn a_file_that_changes_size_is_refused_and_nothing_is_left() {
    let (config, _st) = start(|f| {
        f.faults.insert(
            "adapter_model.safetensors".into(),
            VecDeque::from([Fault::DropAfter(1000), Fault::OtherTotal]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("keep.txt"), b"mine").unwrap();
    let e = download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::SizeMismatch, "{e}");
    assert!(e.to_string().contains("adapter_model.safetensors"), "{e}");
    // The first file was complete, but none is moved into place when one fails.
    assert_eq!(listing(tmp.path()), ["keep.txt"]);
}

#[tokio::test]
async fn a_wrong_digest_is_refused() {
    let (config, _st) = start(|f| {
        f.faults.insert(
            "adapter_config.json".into(),
            VecDeque::from([Fault::BadDigest]),
        );
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let e = download_weights(&config, &external(), tmp.path(), &opts())
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::DigestMismatch, "{e}");
    assert!(listing(tmp.path()).is_empty());
}

#[tokio::test]
async fn a_traversal_name_is_refused_before_anything_is_written() {
    let (config, st) = start(|f| {
        f.files.insert("../x".into(), b"evil".to_vec());
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let e = download_weights(&config, &external(), &out, &opts())
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::UnsafeFileName, "{e}");
    assert!(e.to_string().contains("../x"), "{e}");
    assert!(listing(tmp.path()).is_empty(), "{:?}", listing(tmp.path()));
    assert!(
        !st.lock()
            .unwrap()
            .log
            .iter()
            .any(|(_, p, ..)| p.starts_with("/storage/"))
    );
}

#[tokio::test]
async fn sampler_checkpoints_are_refused_with_the_cookbooks_explanation() {
    let (config, st) = start(|_| {}).await;
    let tmp = tempfile::tempdir().unwrap();
    let path = format!("tinker://{RUN}/sampler_weights/final");
    let e = download_weights(&config, &path, tmp.path(), &opts())
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::SamplerCheckpoint);
    assert!(
        e.to_string().contains(&format!(
            "Sampler checkpoints cannot be downloaded: {path:?}. Download a training checkpoint \
             (tinker://<run_id>/weights/<name>) or external weights saved with \
             TrainingClient.save_weights_external() instead."
        )),
        "{e}"
    );
    assert!(st.lock().unwrap().log.is_empty());
    for bad in [
        "tinker://run/weights",
        "https://x/weights/a",
        "tinker://r/other/a",
    ] {
        let e = download_weights(&config, bad, tmp.path(), &opts())
            .await
            .unwrap_err();
        assert_eq!(kind_of(&e), Kind::InvalidPath, "{bad}");
    }
}

#[tokio::test]
async fn an_unknown_run_is_not_found() {
    let (config, st) = start(|_| {}).await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    for path in [
        "tinker://nope/external_weights/final",
        "tinker://nope/weights/step-1",
    ] {
        let e = download_weights(&config, path, &out, &opts())
            .await
            .unwrap_err();
        assert_eq!(kind_of(&e), Kind::NotFound, "{path}: {e}");
        assert!(e.to_string().contains(path), "{e}");
        assert!(!out.exists());
    }
    // The session of the training route was finished, as errored.
    assert_eq!(
        st.lock().unwrap().finished,
        [json!({"reason": {"type": "errored"}, "detail": null})]
    );
}

#[tokio::test]
async fn a_training_checkpoint_is_exported_encrypted_downloaded_and_deleted() {
    let (config, st) = start(|_| {}).await;
    let tmp = tempfile::tempdir().unwrap();
    let path = format!("tinker://{RUN}/weights/step-10");
    download_weights(&config, &path, tmp.path(), &opts())
        .await
        .unwrap();
    assert_files(tmp.path());
    let f = st.lock().unwrap();
    let export = |m: &str, p: &str| {
        f.log
            .iter()
            .filter(|(mm, pp, ..)| mm == m && pp.ends_with(p))
            .count()
    };
    assert_eq!(export("POST", "/save_weights_external"), 1);
    assert_eq!(export("PUT", "/external_weights/download/ttl"), 1);
    assert_eq!(
        f.deleted,
        [format!(
            "training_runs/{SESSION}:train:0/checkpoints/external_weights/download"
        )]
    );
    assert_eq!(
        f.finished,
        [json!({"reason": {"type": "success"}, "detail": null})]
    );
    // The files were served encrypted (to the recipient the client sent).
    assert!(f.served.keys().all(|k| k.ends_with(".age")));
    assert!(f.encrypt_to.as_deref().unwrap().starts_with("age1"));
}

#[tokio::test]
async fn a_wrong_key_is_a_decryption_error_and_the_export_is_still_deleted() {
    let other = age::x25519::Identity::generate().to_public().to_string();
    let (config, st) = start(move |f| f.override_recipient = Some(other)).await;
    let tmp = tempfile::tempdir().unwrap();
    let path = format!("tinker://{RUN}/weights/step-10");
    let e = download_weights(&config, &path, tmp.path(), &opts())
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::Decrypt, "{e}");
    assert!(listing(tmp.path()).is_empty(), "{:?}", listing(tmp.path()));
    let f = st.lock().unwrap();
    assert_eq!(f.deleted.len(), 1);
    assert_eq!(
        f.finished,
        [json!({"reason": {"type": "errored"}, "detail": null})]
    );
}

#[tokio::test]
async fn an_encrypted_export_is_decrypted_with_the_users_identity() {
    let id = age::x25519::Identity::generate();
    let recipient = id.to_public().to_string();
    let (config, _st) = start(move |f| {
        f.encrypt_to = Some(recipient);
        f.exported = true;
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    use age::secrecy::ExposeSecret;
    let secret = id.to_string().expose_secret().to_string();
    // Without the identity: the files as stored, encrypted.
    let raw = tmp.path().join("raw");
    download_weights(&config, &external(), &raw, &opts())
        .await
        .unwrap();
    assert_eq!(
        listing(&raw),
        ["adapter_config.json.age", "adapter_model.safetensors.age"]
    );
    let plain = tmp.path().join("plain");
    download_weights(&config, &external(), &plain, &opts().age_identity(secret))
        .await
        .unwrap();
    assert_files(&plain);
    let e = download_weights(
        &config,
        &external(),
        tmp.path().join("x"),
        &opts().age_identity("AGE-SECRET-KEY-1NOTAKEY"),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::Config { .. }), "{e}");
}

#[tokio::test]
async fn an_unwritable_output_directory_names_the_path() {
    let (config, _st) = start(|_| {}).await;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = file.join("adapter");
    let e = download_weights(&config, &external(), &out, &opts())
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::Write, "{e}");
    assert!(e.to_string().contains(&out.display().to_string()), "{e}");
}

#[tokio::test]
async fn the_calls_underneath_send_the_sdks_bodies() {
    use rlvr::backend::tinker::{TinkerBackendOptions, TinkerClient, TinkerRestClient};
    let (config, st) = start(|_| {}).await;
    let client = TinkerClient::connect(config.clone()).await.unwrap();
    let options = TinkerBackendOptions {
        tokenizer: Some(crate::common::tiny_tokenizer()),
    };
    let backend = client
        .create_training_from_state(&format!("tinker://{RUN}/weights/step-10"), options)
        .await
        .unwrap();
    assert_eq!(backend.base_model(), "Qwen/Qwen3-8B");
    let path = backend
        .save_weights_external("final", Some(7200), &[])
        .await
        .unwrap();
    assert_eq!(
        path,
        format!("tinker://{SESSION}:train:0/external_weights/download")
    );
    let rest = TinkerRestClient::connect(&config).await.unwrap();
    let urls = rest.external_weights_urls(&path).await.unwrap();
    assert_eq!(urls.urls.len(), 2);
    assert!(urls.expires.is_some());
    // The URLs carry signatures: never shown in debug output.
    assert!(!format!("{urls:?}").contains("sig="));
    rest.set_checkpoint_ttl(&path, None).await.unwrap();
    rest.delete_checkpoint(&path).await.unwrap();
    let e = rest
        .external_weights_urls(&format!("tinker://{RUN}/weights/x"))
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::InvalidPath);
    client.close().await.unwrap();

    let f = st.lock().unwrap();
    let body_of = |suffix: &str| -> Value {
        let (_, _, _, _, b) = f.log.iter().find(|(_, p, ..)| p.ends_with(suffix)).unwrap();
        serde_json::from_slice(b).unwrap()
    };
    assert_eq!(
        body_of("/load_weights"),
        json!({"session_id": SESSION, "model_seq_id": 0,
               "path": format!("tinker://{RUN}/weights/step-10"),
               "optimizer": false, "type": "load_weights"})
    );
    assert_eq!(
        body_of("/save_weights_external"),
        json!({"model_id": format!("{SESSION}:train:0"), "path": "final", "seq_id": 1,
               "ttl_seconds": 7200, "type": "save_weights_external"})
    );
    assert_eq!(body_of("/ttl"), json!({"ttl_seconds": null}));
    assert_eq!(
        f.deleted,
        [format!(
            "training_runs/{SESSION}:train:0/checkpoints/external_weights/download"
        )]
    );
}

#[tokio::test]
async fn a_full_disk_is_a_write_error_and_nothing_is_left() {
    let test = "a_full_disk_is_a_write_error_and_nothing_is_left";
    if !crate::common::isolate::runs_here(module_path!(), test) {
        return; // it ran, and passed, in a child process
    }
    // In this process alone: no file may grow past 100 KB, so writing the 200 KB file fails
    // (EFBIG, with SIGXFSZ ignored) as on a full disk (ENOSPC), by the same path.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim), 0);
        lim.rlim_cur = 100_000;
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
    let (config, _st) = start(|_| {}).await;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let e = download_weights(&config, &external(), &out, &opts())
        .await
        .unwrap_err();
    assert_eq!(kind_of(&e), Kind::Write, "{e}");
    let Error::WeightsDownload { file, message, .. } = &e else {
        unreachable!()
    };
    assert_eq!(file.as_deref(), Some("adapter_model.safetensors"));
    assert!(message.contains(&out.display().to_string()), "{e}");
    assert!(!out.exists(), "{:?}", listing(&out));
}

// ---- The recorded requests of the SDK/cookbook ----

fn wire_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tinker-wire/weights")
}

struct Replay {
    base: String,
    queue: VecDeque<(String, Value)>,
    got: Vec<Got>,
    unexpected: Vec<String>,
    plaintext: BTreeMap<String, Vec<u8>>,
    recipient: Option<String>,
}

/// A request received, with the recorded exchange it was answered with.
struct Got {
    name: String,
    ex: Value,
    method: String,
    path: String,
    query: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

const RECORDED_BASE: &str = "http://127.0.0.1:8766";

async fn replay_handle(
    State(st): State<Arc<Mutex<Replay>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut st = st.lock().unwrap();
    if uri.path().ends_with("/session_heartbeat") || uri.path().ends_with("/telemetry") {
        return json_resp(json!({}));
    }
    let Some((name, ex)) = st.queue.pop_front() else {
        st.unexpected.push(format!("{method} {uri}"));
        return (StatusCode::IM_A_TEAPOT, "no more recorded exchanges").into_response();
    };
    let r = &ex["response"];
    let status = StatusCode::from_u16(r["status"].as_u64().unwrap() as u16).unwrap();
    let mut body_out: Vec<u8> = if let Some(b) = r["body_b64"].as_str() {
        base64::engine::general_purpose::STANDARD.decode(b).unwrap()
    } else {
        r["body_text"].as_str().unwrap_or("").as_bytes().to_vec()
    };
    let req_path = ex["request"]["path"].as_str().unwrap();
    if req_path.ends_with("/save_weights_external") {
        let v: Value = serde_json::from_slice(&body).unwrap();
        st.recipient = v["age_encryption_recipients"][0]
            .as_str()
            .map(str::to_string);
    }
    if req_path.ends_with("/external_weights_urls") {
        // The recorded URLs point at the recording server, and their expiry has passed.
        let mut v: Value = serde_json::from_slice(&body_out).unwrap();
        for u in v["urls"].as_object_mut().unwrap().values_mut() {
            *u = u.as_str().unwrap().replace(RECORDED_BASE, &st.base).into();
        }
        v["expires"] =
            rfc3339(std::time::SystemTime::now() + std::time::Duration::from_secs(3600)).into();
        body_out = v.to_string().into_bytes();
    }
    if let Some(file) = req_path
        .strip_prefix("/storage/")
        .and_then(|p| p.rsplit('/').next())
    {
        // An encrypted file: encrypted again to the recipient this client sent.
        if let Some(plain) = file.strip_suffix(".age") {
            let r = st.recipient.clone().expect("no recipient was sent");
            body_out = age_encrypt(&st.plaintext[plain], &r);
        }
    }
    let ct = r["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("content-type"))
        .map(|h| h[1].as_str().unwrap().to_string())
        .unwrap_or_else(|| "application/json".into());
    st.got.push(Got {
        name,
        ex: ex.clone(),
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().unwrap_or("").to_string(),
        headers,
        body: body.to_vec(),
    });
    (status, [("content-type", ct)], body_out).into_response()
}

const SEMANTIC_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "x-stainless-retry-count",
    "x-stainless-read-timeout",
    "x-tinker-request-iteration",
    "x-tinker-request-type",
    "x-sdk-version",
    "x-sdk-method",
];

fn recorded_header(ex: &Value, name: &str) -> Option<String> {
    ex["request"]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0].as_str().unwrap().eq_ignore_ascii_case(name))
        .map(|h| h[1].as_str().unwrap().to_string())
}

async fn replay_scenario(scenario: &str) {
    let dir = wire_dir().join(scenario);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    let queue: VecDeque<(String, Value)> = names
        .iter()
        .map(|n| {
            let text = std::fs::read_to_string(dir.join(n)).unwrap();
            (n.clone(), serde_json::from_str(&text).unwrap())
        })
        .collect();
    let files: BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(wire_dir().join("files.json")).unwrap())
            .unwrap();
    let plaintext: BTreeMap<String, Vec<u8>> = files
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                base64::engine::general_purpose::STANDARD.decode(v).unwrap(),
            )
        })
        .collect();
    let st = Arc::new(Mutex::new(Replay {
        base: String::new(),
        queue,
        got: Vec::new(),
        unexpected: Vec::new(),
        plaintext: plaintext.clone(),
        recipient: None,
    }));
    let app = axum::Router::new()
        .fallback(replay_handle)
        .with_state(Arc::clone(&st));
    let addr = crate::common::serve(app).await;
    st.lock().unwrap().base = format!("http://{addr}");
    let config = TinkerConfig::new(KEY)
        .unwrap()
        .base_url(format!("http://{addr}"));
    // The tinker path the cookbook was asked for: in the first request of its kind.
    let tinker_path = match scenario {
        "external" => "tinker://capture-run-0001/external_weights/final",
        _ => "tinker://capture-run-0001/weights/step-10",
    };
    let tmp = tempfile::tempdir().unwrap();
    download_weights(&config, tinker_path, tmp.path(), &opts())
        .await
        .unwrap();
    for (name, data) in &plaintext {
        assert_eq!(
            &std::fs::read(tmp.path().join(name)).unwrap(),
            data,
            "{name}"
        );
    }

    let st = st.lock().unwrap();
    assert!(
        st.unexpected.is_empty(),
        "unexpected requests: {:?}",
        st.unexpected
    );
    let left: Vec<&str> = st.queue.iter().map(|e| e.0.as_str()).collect();
    assert!(
        left.is_empty(),
        "recorded exchanges never requested: {left:?}"
    );
    for Got {
        name,
        ex,
        method,
        path,
        query,
        headers,
        body,
    } in &st.got
    {
        let ctx = format!("{scenario}/{name}");
        let req = &ex["request"];
        assert_eq!(method, req["method"].as_str().unwrap(), "{ctx}: method");
        assert_eq!(path, req["path"].as_str().unwrap(), "{ctx}: path");
        let recorded_query = req["raw_request_target"]
            .as_str()
            .unwrap()
            .split_once('?')
            .map(|q| q.1)
            .unwrap_or("");
        assert_eq!(query, recorded_query, "{ctx}: query");
        if path.starts_with("/storage/") {
            // The signed URL is fetched as is: no credential, no SDK headers.
            assert!(headers.get("x-api-key").is_none(), "{ctx}");
            continue;
        }
        let ours = |h: &str| headers.get(h).map(|v| v.to_str().unwrap().to_string());
        for h in SEMANTIC_HEADERS {
            let timeout = *h == "x-stainless-read-timeout";
            let norm = |v: Option<String>| {
                v.map(|s| {
                    if timeout {
                        format!("{}", s.parse::<f64>().unwrap())
                    } else {
                        s
                    }
                })
            };
            assert_eq!(
                norm(ours(h)),
                norm(recorded_header(ex, h)),
                "{ctx}: header {h}"
            );
        }
        assert_eq!(
            ours("x-idempotency-key").is_some(),
            recorded_header(ex, "x-idempotency-key").is_some(),
            "{ctx}: idempotency key"
        );
        assert_eq!(ours("x-api-key").as_deref(), Some(KEY), "{ctx}: credential");
        match req
            .get("body_json")
            .filter(|_| req["body_len"].as_u64() != Some(0))
        {
            Some(expected) => {
                let mut ours: Value = serde_json::from_slice(body)
                    .unwrap_or_else(|e| panic!("{ctx}: body is not JSON ({e})"));
                let mut expected = expected.clone();
                // The key is made for each download: compare its form, then the rest.
                if let Some(r) = ours.get_mut("age_encryption_recipients") {
                    let ours_r = r[0].as_str().unwrap().to_string();
                    assert!(ours_r.starts_with("age1") && r.as_array().unwrap().len() == 1);
                    expected["age_encryption_recipients"][0] = ours_r.into();
                }
                assert_eq!(ours, expected, "{ctx}: JSON body");
            }
            None => assert!(body.is_empty(), "{ctx}: unexpected body"),
        }
    }
}

#[tokio::test]
async fn external_weights_requests_match_the_cookbook_recording() {
    replay_scenario("external").await;
}

#[tokio::test]
async fn training_checkpoint_requests_match_the_cookbook_recording() {
    replay_scenario("training").await;
}
