//! Hub downloads and the cache, against a local server that answers like the Hugging Face hub
//! (`/{datasets/}{repo}/resolve/{revision}/{file}`, ranged GETs, `etag`, `x-repo-commit`,
//! `content-range`), counting requests to show that cached files cost none.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use rlvr::Error;
use rlvr::hub::{Hub, HubOptions, HubRepo};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Default)]
pub(crate) struct FakeHub {
    /// URL path → content.
    pub(crate) files: HashMap<String, Vec<u8>>,
    /// URL path → `(absolute location, sha256-like etag)`: LFS files, which the hub
    /// redirects to a CDN on another host with `x-linked-etag` and `x-repo-commit`.
    lfs: HashMap<String, (String, String)>,
    /// `"{method} {path} {range} {authorization}"` of every request.
    log: Mutex<Vec<String>>,
}

impl FakeHub {
    pub(crate) fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

async fn serve(
    State(hub): State<Arc<FakeHub>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    hub.log.lock().unwrap().push(format!(
        "{method} {} {} {}",
        uri.path(),
        header("range"),
        header("authorization")
    ));
    if let Some((location, etag)) = hub.lfs.get(uri.path()) {
        return Response::builder()
            .status(StatusCode::FOUND)
            .header("location", location)
            .header("x-linked-etag", format!("\"{etag}\""))
            .header("etag", "\"pointer-etag\"")
            .header("x-repo-commit", COMMIT)
            .body(Body::empty())
            .unwrap();
    }
    let Some(content) = hub.files.get(uri.path()) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header("x-error-code", "EntryNotFound")
            .body(Body::from("Entry not found"))
            .unwrap();
    };
    let len = content.len();
    // `bytes=a-b`, b inclusive and clamped to the end, as the hub (S3) does.
    let (start, end) = match header("range").strip_prefix("bytes=") {
        Some(spec) => {
            let (a, b) = spec.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b: usize = b.parse::<usize>().unwrap().min(len - 1);
            (a, b)
        }
        None => (0, len - 1),
    };
    let etag = format!("\"{:016x}{len:08x}\"", fnv(content));
    Response::builder()
        .status(StatusCode::PARTIAL_CONTENT)
        .header("etag", etag)
        .header("x-repo-commit", COMMIT)
        .header("accept-ranges", "bytes")
        .header("content-range", format!("bytes {start}-{end}/{len}"))
        .body(Body::from(content[start..=end].to_vec()))
        .unwrap()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Starts the fake hub on 127.0.0.1; returns its endpoint.
pub(crate) async fn start(hub: Arc<FakeHub>) -> String {
    let app = Router::new().fallback(serve).with_state(hub);
    let addr = crate::common::serve(app).await;
    format!("http://{addr}")
}

#[cfg(feature = "parquet")]
fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub(crate) fn options(endpoint: &str, cache: &Path) -> HubOptions {
    HubOptions::default()
        .with_endpoint(endpoint)
        .with_cache_dir(cache)
        .with_token("hf_test_token")
        .with_offline(false)
}

#[cfg(feature = "parquet")]
mod gsm8k {
    use super::*;
    use rlvr::{Dataset, Gsm8k, dataset::Split};

    const TRAIN_URL: &str = "/datasets/openai/gsm8k/resolve/main/main/train-00000-of-00001.parquet";

    fn fake_hub() -> Arc<FakeHub> {
        let mut hub = FakeHub::default();
        let parquet =
            std::fs::read(fixtures().join("gsm8k/main/train-00000-of-00001.parquet")).unwrap();
        hub.files.insert(TRAIN_URL.to_string(), parquet);
        Arc::new(hub)
    }

    #[tokio::test]
    async fn download_fills_the_cache_and_the_second_load_makes_no_request() {
        let hub = fake_hub();
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let opts = options(&endpoint, cache.path());

        let downloaded = Gsm8k::download(Split::Train, &opts).await.unwrap();
        let requests = hub.requests();
        // hf-hub asks for the metadata with a one-byte range, then fetches the file.
        assert_eq!(requests.len(), 2, "{requests:#?}");
        assert!(
            requests
                .iter()
                .all(|r| r.starts_with(&format!("GET {TRAIN_URL} bytes=0-"))
                    && r.ends_with("Bearer hf_test_token"))
        );

        let local = Gsm8k::from_parquet(fixtures().join("gsm8k/main/train-00000-of-00001.parquet"))
            .unwrap();
        assert_eq!(downloaded.len(), 20);
        for i in 0..local.len() {
            assert_eq!(downloaded.get(i).unwrap(), local.get(i).unwrap());
        }
        assert_eq!(downloaded.get(3).unwrap().id, "gsm8k/train/3");

        // The huggingface_hub cache layout.
        let repo_dir = cache.path().join("datasets--openai--gsm8k");
        assert_eq!(
            std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
            COMMIT
        );
        let snapshot = repo_dir
            .join("snapshots")
            .join(COMMIT)
            .join("main/train-00000-of-00001.parquet");
        assert_eq!(downloaded.source(), snapshot);
        assert_eq!(
            std::fs::read(&snapshot).unwrap(),
            std::fs::read(fixtures().join("gsm8k/main/train-00000-of-00001.parquet")).unwrap()
        );

        // Second load: from the cache, no request at all.
        let again = Gsm8k::download(Split::Train, &opts).await.unwrap();
        assert_eq!(hub.requests().len(), 2);
        assert_eq!(again.get(19).unwrap(), downloaded.get(19).unwrap());

        // Offline mode uses the cache too.
        let offline = opts.clone().with_offline(true);
        Gsm8k::download(Split::Train, &offline).await.unwrap();
        assert_eq!(hub.requests().len(), 2);
    }

    /// The real GSM8K files are LFS files: the hub answers 302 to a CDN on another host.
    #[tokio::test]
    async fn lfs_files_redirected_to_another_host_are_downloaded() {
        let parquet =
            std::fs::read(fixtures().join("gsm8k/main/train-00000-of-00001.parquet")).unwrap();
        let mut cdn = FakeHub::default();
        cdn.files.insert("/blob/abc123".into(), parquet.clone());
        let cdn = Arc::new(cdn);
        let cdn_endpoint = start(cdn.clone()).await;

        let mut hub = FakeHub::default();
        let sha = "b".repeat(64);
        hub.lfs.insert(
            TRAIN_URL.into(),
            (format!("{cdn_endpoint}/blob/abc123"), sha.clone()),
        );
        let hub = Arc::new(hub);
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let opts = options(&endpoint, cache.path());

        let train = Gsm8k::download(Split::Train, &opts).await.unwrap();
        assert_eq!(train.len(), 20);
        // The blob is stored under the linked (content) etag, not the pointer's.
        let blob = cache
            .path()
            .join("datasets--openai--gsm8k/blobs")
            .join(&sha);
        assert_eq!(std::fs::read(blob).unwrap(), parquet);
        let (hub_requests, cdn_requests) = (hub.requests().len(), cdn.requests().len());
        assert!(
            hub_requests >= 1 && cdn_requests >= 1,
            "{hub_requests} {cdn_requests}"
        );
        // The data itself is fetched through a redirect, which drops the token on the way
        // to the other host. (hf-hub's one-byte size probe of the redirect target does send
        // it: a known hf-hub 0.5 behaviour, harmless with the real hub's own CDN.)
        let cdn_log = cdn.requests();
        // hf-hub asks for `bytes=0-{len}` (one past the end; servers clamp).
        let data_fetch = format!("GET /blob/abc123 bytes=0-{} ", parquet.len());
        assert!(
            cdn_log
                .iter()
                .any(|r| r.starts_with(&data_fetch) && r.ends_with(" -")),
            "{cdn_log:#?}"
        );

        Gsm8k::download(Split::Train, &opts).await.unwrap();
        assert_eq!(hub.requests().len(), hub_requests);
        assert_eq!(cdn.requests().len(), cdn_requests);
    }

    #[tokio::test]
    async fn missing_file_is_a_hub_error_naming_repo_and_file() {
        let hub = fake_hub();
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();

        let err = Gsm8k::download(Split::Test, &options(&endpoint, cache.path()))
            .await
            .unwrap_err();
        let text = err.to_string();
        match err {
            Error::Hub {
                repo,
                file,
                message,
            } => {
                assert_eq!(repo, "openai/gsm8k");
                assert_eq!(file, "main/test-00000-of-00001.parquet");
                assert!(message.contains("404"), "{message}");
            }
            other => panic!("expected Error::Hub, got {other:?}"),
        }
        assert!(
            text.contains("openai/gsm8k/main/test-00000-of-00001.parquet"),
            "{text}"
        );
        // Nothing half-written is left where the cache would find it.
        let repo_dir = cache.path().join("datasets--openai--gsm8k");
        assert!(!repo_dir.join("refs/main").exists());
        assert!(!repo_dir.join("snapshots").exists());

        // Offline with an empty cache: an error without a request.
        let before = hub.requests().len();
        let offline = options(&endpoint, cache.path()).with_offline(true);
        let err = Gsm8k::download(Split::Train, &offline).await.unwrap_err();
        assert!(matches!(err, Error::Hub { .. }), "{err:?}");
        assert!(err.to_string().contains("offline"), "{err}");
        assert_eq!(hub.requests().len(), before);
    }

    #[tokio::test]
    async fn pinned_revisions_use_their_own_url_and_ref() {
        let mut hub = FakeHub::default();
        let parquet =
            std::fs::read(fixtures().join("gsm8k/main/test-00000-of-00001.parquet")).unwrap();
        hub.files.insert(
            "/datasets/me/gsm8k-mirror/resolve/v1.0/main/test-00000-of-00001.parquet".into(),
            parquet,
        );
        let hub = Arc::new(hub);
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let client = Hub::new(&options(&endpoint, cache.path())).unwrap();
        let repo = HubRepo::dataset("me/gsm8k-mirror").with_revision("v1.0");
        let test = Gsm8k::download_from(&client, &repo, Split::Test)
            .await
            .unwrap();
        assert_eq!(test.len(), 10);
        assert_eq!(test.get(0).unwrap().id, "gsm8k/test/0");
        assert!(
            cache
                .path()
                .join("datasets--me--gsm8k-mirror/refs/v1.0")
                .is_file()
        );
        assert_eq!(hub.requests().len(), 2);
    }
}

/// A tiny word-level tokenizer.
const TOKENIZER_JSON: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null,
  "decoder": null,
  "model": {
    "type": "WordLevel",
    "vocab": {"<unk>": 0, "hello": 1, "world": 2, "<s>": 3, "</s>": 4, "<|endoftext|>": 5},
    "unk_token": "<unk>"
  }
}"#;

mod tokenizer {
    use super::*;
    use rlvr::tokenizer::Tokenizer;

    #[tokio::test]
    async fn from_pretrained_downloads_once_and_reads_the_config() {
        let mut hub = FakeHub::default();
        hub.files.insert(
            "/org/tiny/resolve/main/tokenizer.json".into(),
            TOKENIZER_JSON.as_bytes().to_vec(),
        );
        hub.files.insert(
            "/org/tiny/resolve/main/tokenizer_config.json".into(),
            br#"{"bos_token": "<s>", "eos_token": {"content": "</s>"}}"#.to_vec(),
        );
        let hub = Arc::new(hub);
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let client = Hub::new(&options(&endpoint, cache.path())).unwrap();
        let repo = HubRepo::model("org/tiny");

        let tok = Tokenizer::from_pretrained_with(&client, &repo)
            .await
            .unwrap();
        assert_eq!(tok.encode("hello world").unwrap(), [1, 2]);
        assert_eq!(tok.bos_token_id(), Some(3));
        assert_eq!(tok.eos_token_id(), Some(4));
        assert_eq!(hub.requests().len(), 4, "{:#?}", hub.requests());

        let again = Tokenizer::from_pretrained_with(&client, &repo)
            .await
            .unwrap();
        assert_eq!(again.eos_token_id(), Some(4));
        assert_eq!(
            hub.requests().len(),
            4,
            "the second load is served by the cache"
        );
    }

    #[tokio::test]
    async fn a_missing_config_is_remembered_and_a_missing_tokenizer_is_an_error() {
        let mut hub = FakeHub::default();
        hub.files.insert(
            "/org/noconfig/resolve/main/tokenizer.json".into(),
            TOKENIZER_JSON.as_bytes().to_vec(),
        );
        let hub = Arc::new(hub);
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let client = Hub::new(&options(&endpoint, cache.path())).unwrap();

        let repo = HubRepo::model("org/noconfig");
        let tok = Tokenizer::from_pretrained_with(&client, &repo)
            .await
            .unwrap();
        // Without a config the EOS is guessed from the common end-of-text tokens.
        assert_eq!(tok.eos_token_id(), Some(5));
        assert_eq!(tok.bos_token_id(), None);
        // tokenizer.json (metadata + data) and one 404 for tokenizer_config.json.
        assert_eq!(hub.requests().len(), 3, "{:#?}", hub.requests());
        assert!(
            cache
                .path()
                .join("models--org--noconfig/.no_exist")
                .join(COMMIT)
                .join("tokenizer_config.json")
                .is_file()
        );
        Tokenizer::from_pretrained_with(&client, &repo)
            .await
            .unwrap();
        assert_eq!(
            hub.requests().len(),
            3,
            "the known absence costs no request"
        );

        let err = Tokenizer::from_pretrained_with(&client, &HubRepo::model("org/absent"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Hub { ref repo, ref file, .. }
                if repo == "org/absent" && file == "tokenizer.json"),
            "{err:?}"
        );

        let before = hub.requests().len();
        let err = Tokenizer::for_model(&client, "TML/secret-model", None)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
        assert_eq!(hub.requests().len(), before);
    }

    #[tokio::test]
    async fn for_model_applies_the_sdk_rules() {
        let mut hub = FakeHub::default();
        hub.files.insert(
            "/org/model/resolve/main/tokenizer.json".into(),
            TOKENIZER_JSON.as_bytes().to_vec(),
        );
        let hub = Arc::new(hub);
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let client = Hub::new(&options(&endpoint, cache.path())).unwrap();
        // `org/model/variant:suffix` → repository `org/model`.
        let tok = Tokenizer::for_model(&client, "org/model/variant:abc", None)
            .await
            .unwrap();
        assert_eq!(tok.encode("world").unwrap(), [2]);
        assert!(
            hub.requests()
                .iter()
                .all(|r| r.starts_with("GET /org/model/resolve/main/"))
        );
    }
}

#[tokio::test]
async fn a_server_that_is_not_a_hub_is_reported() {
    // Answers 200 without the hub's headers.
    let app = Router::new().fallback(|| async { "hello" });
    let addr = crate::common::serve(app).await;
    let cache = tempfile::tempdir().unwrap();
    let client = Hub::new(&options(&format!("http://{addr}"), cache.path())).unwrap();
    let err = client
        .get(&HubRepo::model("org/x"), "config.json")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Hub { .. }), "{err:?}");
    assert!(
        text.contains("header") && text.contains("org/x/config.json"),
        "{text}"
    );
}

/// `LocalBackend::from_pretrained_with`: a Hugging Face model repository downloaded into the
/// cache and loaded like a model directory.
#[cfg(feature = "local")]
mod local_model {
    use super::*;
    use rlvr::PolicyBackend;
    use rlvr::backend::local::{LocalBackend, LocalOptions};

    const REPO: &str = "org/tiny-qwen3";

    fn model_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-tiny/untied")
    }

    fn url(file: &str) -> String {
        format!("/{REPO}/resolve/main/{file}")
    }

    /// The fixture's files, served as the repository `REPO`; without `model.safetensors`
    /// when `sharded`, which is then split into two shards and an index.
    fn fake_hub(sharded: bool) -> Arc<FakeHub> {
        let dir = model_dir();
        let mut hub = FakeHub::default();
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            hub.files
                .insert(url(f), std::fs::read(dir.join(f)).unwrap());
        }
        if !sharded {
            let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
            hub.files.insert(url("model.safetensors"), weights);
            return Arc::new(hub);
        }
        let tensors = candle_core::safetensors::load(
            dir.join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        let tmp = tempfile::tempdir().unwrap();
        let mut weight_map = serde_json::Map::new();
        for k in 0..2 {
            let shard_name = format!("model-0000{}-of-00002.safetensors", k + 1);
            let shard: HashMap<String, candle_core::Tensor> = names
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 2 == k)
                .map(|(_, n)| ((*n).clone(), tensors[*n].clone()))
                .collect();
            for n in shard.keys() {
                weight_map.insert(n.clone(), shard_name.clone().into());
            }
            let path = tmp.path().join(&shard_name);
            candle_core::safetensors::save(&shard, &path).unwrap();
            hub.files
                .insert(url(&shard_name), std::fs::read(&path).unwrap());
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        hub.files.insert(
            url("model.safetensors.index.json"),
            index.to_string().into_bytes(),
        );
        Arc::new(hub)
    }

    async fn logits(backend: &LocalBackend) -> Vec<Vec<f32>> {
        backend
            .sampler()
            .await
            .unwrap()
            .logits_blocking(&[3, 4, 5, 6])
            .unwrap()
    }

    async fn load_twice_and_compare(sharded: bool) -> Vec<String> {
        let hub = fake_hub(sharded);
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let client = Hub::new(&options(&endpoint, cache.path())).unwrap();
        let repo = HubRepo::model(REPO);

        let downloaded =
            LocalBackend::from_pretrained_with(&client, &repo, LocalOptions::default())
                .await
                .unwrap();
        let local = LocalBackend::from_dir(model_dir(), LocalOptions::default()).unwrap();
        assert_eq!(downloaded.config(), local.config());
        assert_eq!(downloaded.tokenizer().eos_token_id(), Some(1));
        assert_eq!(logits(&downloaded).await, logits(&local).await);

        // Everything is cached now (the missing file too): loading again makes no request.
        let requests = hub.requests();
        LocalBackend::from_pretrained_with(&client, &repo, LocalOptions::default())
            .await
            .unwrap();
        assert_eq!(hub.requests(), requests);
        requests
    }

    #[tokio::test]
    async fn a_single_file_model_is_downloaded_and_loaded() {
        let requests = load_twice_and_compare(false).await;
        let files: Vec<&str> = requests
            .iter()
            .filter_map(|r| r.split(' ').nth(1))
            .filter_map(|p| p.strip_prefix(&format!("/{REPO}/resolve/main/")))
            .collect();
        for f in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors",
        ] {
            assert!(files.contains(&f), "{f} not requested: {requests:#?}");
        }
        assert!(!files.contains(&"model.safetensors.index.json"));
    }

    #[tokio::test]
    async fn a_sharded_model_is_downloaded_through_its_index() {
        let requests = load_twice_and_compare(true).await;
        for f in [
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ] {
            assert!(
                requests.iter().any(|r| r.contains(&url(f))),
                "{f} not requested: {requests:#?}"
            );
        }
    }

    #[tokio::test]
    async fn a_missing_tokenizer_is_named() {
        let mut hub = FakeHub::default();
        let dir = model_dir();
        for f in ["config.json", "model.safetensors"] {
            hub.files
                .insert(url(f), std::fs::read(dir.join(f)).unwrap());
        }
        let endpoint = start(Arc::new(hub)).await;
        let cache = tempfile::tempdir().unwrap();
        let client = Hub::new(&options(&endpoint, cache.path())).unwrap();
        let err = LocalBackend::from_pretrained_with(
            &client,
            &HubRepo::model(REPO),
            LocalOptions::default(),
        )
        .await
        .unwrap_err();
        match &err {
            Error::Hub { repo, file, .. } => {
                assert_eq!((repo.as_str(), file.as_str()), (REPO, "tokenizer.json"))
            }
            other => panic!("{other:?}"),
        }
    }
}
