//! Request plumbing: URLs, the SDK's headers, HTTP-layer retries with a stable idempotency
//! key, the holder-level retry loop, and the JWT exchange.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use reqwest::Method;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::de::DeserializeOwned;

use super::config::{SDK_VERSION, Secret, TinkerConfig};
use crate::error::{Error, Result};

/// Longest `Retry-After` the client honours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// How much of an error body is kept in an [`Error::Http`].
const MAX_ERROR_BODY: usize = 4096;

/// A request body.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    /// No body (GET).
    None,
    /// A JSON document (already serialized).
    Json(Bytes),
    /// A protobuf message, optionally zstd-compressed on the wire. (`Bytes`: each attempt
    /// sends the same buffer, shared rather than copied.)
    Proto { bytes: Bytes, zstd: bool },
}

/// One logical SDK call (retried at the HTTP layer with the same idempotency key).
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub method: Method,
    /// Endpoint path below `/api/v1/`, without a leading slash.
    pub path: String,
    pub body: Body,
    pub accept: &'static str,
    pub max_retries: u32,
    pub timeout: Duration,
    /// Request-specific headers, sent before the idempotency key.
    pub headers: Vec<(&'static str, String)>,
    /// The SDK method this call belongs to (`x-sdk-method`), if any.
    pub sdk_method: Option<&'static str>,
    /// Authenticate with the raw API key even when JWT auth is on (client/config, auth/token).
    pub raw_key: bool,
}

impl Call {
    /// A JSON POST with the default retry budget.
    pub fn post_json(
        http: &Http,
        path: impl Into<String>,
        body: &impl serde::Serialize,
    ) -> Result<Self> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::Backend(format!("serializing request: {e}")))?;
        Ok(Self::post_json_bytes(http, path, bytes.into()))
    }
    /// A JSON POST of a body already serialized.
    pub fn post_json_bytes(http: &Http, path: impl Into<String>, json: Bytes) -> Self {
        Call {
            method: Method::POST,
            path: path.into(),
            body: Body::Json(json),
            accept: "application/json",
            max_retries: http.max_retries,
            timeout: http.timeout,
            headers: Vec::new(),
            sdk_method: None,
            raw_key: false,
        }
    }
    /// Sets `x-sdk-method`.
    pub fn sdk(mut self, method: &'static str) -> Self {
        self.sdk_method = Some(method);
        self
    }
    /// Sets the HTTP retry budget.
    pub fn retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }
    /// Sets the timeout.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Adds a request-specific header.
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
    fn display(&self) -> String {
        format!("/api/v1/{}", self.path)
    }
}

/// How many endpoint URLs [`Http`] keeps parsed (the SDK's calls use a dozen paths; the
/// per-session ones add one each).
const URL_CACHE_MAX: usize = 64;

/// Inserts the header `name: text`, `text` checked to be a valid header value.
fn insert_text(headers: &mut HeaderMap, name: HeaderName, text: &str) -> Result<()> {
    let value = HeaderValue::from_str(text)
        .map_err(|_| Error::config("header", format!("invalid value for header `{name}`")))?;
    headers.insert(name, value);
    Ok(())
}

/// A response as received (any status).
#[derive(Debug)]
pub(crate) struct RawResponse {
    pub status: u16,
    pub headers: HeaderMap,
    /// The body as received (shared, not copied).
    pub body: Bytes,
}

impl RawResponse {
    /// Whether the body is protobuf (by content type).
    pub fn is_protobuf(&self) -> bool {
        self.headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("application/x-protobuf"))
    }
    /// The body as (lossy) text, truncated for error messages.
    pub fn body_text(&self) -> String {
        let end = self.body.len().min(MAX_ERROR_BODY);
        String::from_utf8_lossy(&self.body[..end]).into_owned()
    }
}

/// Decodes a JSON body, keeping the raw body on failure.
/// `what` names the body in the error; it is formatted only then.
pub(crate) fn decode_json<T: DeserializeOwned>(
    body: &[u8],
    what: impl std::fmt::Display,
) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| Error::Decode {
        what: what.to_string(),
        message: e.to_string(),
        raw: body.to_vec(),
    })
}

#[derive(Clone)]
struct Jwt {
    token: Secret,
    /// Expiry (unix seconds), when the token says.
    exp: Option<u64>,
    /// Lifetime `exp − iat` in seconds, when the token says.
    lifetime: Option<u64>,
    received: Instant,
}

/// The HTTP client shared by a session: base URL, credentials, retry policy.
pub(crate) struct Http {
    client: reqwest::Client,
    base_url: String,
    /// Endpoint URLs parsed once (by path below `/api/v1/`; bounded by [`URL_CACHE_MAX`]).
    urls: Mutex<HashMap<String, reqwest::Url>>,
    api_key: Secret,
    jwt_enabled: AtomicBool,
    jwt: Mutex<Option<Jwt>>,
    jwt_refresh: tokio::sync::Mutex<()>,
    pub max_retries: u32,
    pub timeout: Duration,
    /// Timeout of one `retrieve_future` long-poll.
    pub poll_timeout: Duration,
    /// Factor on every client-side back-off ([`TinkerConfig::backoff_scale`]).
    backoff_scale: f64,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// `min(0.5 × 2^k, 10) × (1 − 0.25 × U)` seconds: the HTTP layer's back-off.
pub(crate) fn http_backoff(retries_taken: u32) -> Duration {
    let base = (0.5 * 2f64.powi(retries_taken.min(16) as i32)).min(10.0);
    Duration::from_secs_f64(base * (1.0 - 0.25 * rand::random::<f64>()))
}

/// `Retry-After-Ms` / `Retry-After` (seconds or HTTP date) when in (0, 60] s.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        let d = ms / 1000.0;
        if d > 0.0 && d <= MAX_RETRY_AFTER.as_secs_f64() {
            return Some(Duration::from_secs_f64(d));
        }
    }
    let v = headers.get("retry-after")?.to_str().ok()?.trim();
    let secs = match v.parse::<f64>() {
        Ok(s) => s,
        Err(_) => {
            let when = httpdate_to_unix(v)?;
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()?
                .as_secs_f64();
            when as f64 - now
        }
    };
    if secs > 0.0 && secs <= MAX_RETRY_AFTER.as_secs_f64() {
        Some(Duration::from_secs_f64(secs))
    } else {
        None
    }
}

/// Parses an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, and the obsolete forms HTTP/1.1
/// still accepts) to unix seconds.
fn httpdate_to_unix(s: &str) -> Option<i64> {
    let t = httpdate::parse_http_date(s).ok()?;
    i64::try_from(t.duration_since(UNIX_EPOCH).ok()?.as_secs()).ok()
}

/// A numeric claim (`exp`, `iat`) of a JWT, if readable.
fn jwt_claim(token: &str, claim: &str) -> Option<u64> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get(claim)?.as_u64()
}

/// The `exp` claim of a JWT, if readable.
fn jwt_exp(token: &str) -> Option<u64> {
    jwt_claim(token, "exp")
}

/// When to refresh a token received at `received` with `lifetime` seconds: `lifetime ×
/// factor` later, or `None` when that instant is not representable (never panics).
fn refresh_due(received: Instant, lifetime: u64, factor: f64) -> Option<Instant> {
    Duration::try_from_secs_f64(lifetime as f64 * factor)
        .ok()
        .and_then(|d| received.checked_add(d))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Http {
    /// Builds the client for `config` (validates the URL first).
    pub fn new(config: &TinkerConfig) -> Result<Self> {
        config.validate()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            // Every failed attempt is retried by `send_raw` (same idempotency key, the SDK's
            // back-off and retry-count header); reqwest's own retry of refused HTTP/2 streams
            // would only add a copy of each request's headers per attempt.
            .retry(reqwest::retry::never().max_retries_per_request(0))
            .user_agent(concat!("rlvr/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Transport {
                endpoint: config.base_url.clone(),
                message: format!("building the HTTP client: {e}"),
            })?;
        Ok(Http {
            client,
            base_url: config.base_url.clone(),
            urls: Mutex::new(HashMap::new()),
            api_key: config.api_key.clone(),
            jwt_enabled: AtomicBool::new(false),
            jwt: Mutex::new(None),
            jwt_refresh: tokio::sync::Mutex::new(()),
            max_retries: config.max_retries,
            timeout: config.request_timeout,
            poll_timeout: config.poll_timeout,
            backoff_scale: config.backoff_scale,
        })
    }

    /// A client-side back-off delay, scaled by the configured factor (1.0 by default).
    pub fn backoff(&self, d: Duration) -> Duration {
        if self.backoff_scale == 1.0 {
            d
        } else {
            Duration::try_from_secs_f64(d.as_secs_f64() * self.backoff_scale).unwrap_or(d)
        }
    }

    /// Switches to JWT auth: exchanges the API key for a token now.
    pub async fn enable_jwt(&self) -> Result<()> {
        self.jwt_enabled.store(true, Ordering::SeqCst);
        self.exchange_jwt().await
    }

    /// Exchanges the API key for a JWT (`auth/token`). Boxed: it sends through `send`,
    /// which may call it again.
    fn exchange_jwt(&self) -> futures::future::BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            #[derive(serde::Deserialize)]
            struct TokenResponse {
                jwt: String,
            }
            let mut call = Call::post_json(self, "auth/token", &serde_json::json!({}))?;
            call.raw_key = true;
            let resp = self.send(call).await?;
            let t: TokenResponse = decode_json(&resp.body, "auth/token response")?;
            let exp = jwt_exp(&t.jwt);
            let lifetime = exp
                .zip(jwt_claim(&t.jwt, "iat"))
                .and_then(|(e, i)| e.checked_sub(i));
            if let Ok(mut g) = self.jwt.lock() {
                *g = Some(Jwt {
                    token: Secret::new(t.jwt),
                    exp,
                    lifetime,
                    received: Instant::now(),
                });
            }
            Ok(())
        })
    }

    /// Background JWT refresh, as the SDK: `(exp − iat) × U(0.45, 0.55)` after each token
    /// arrives; after a failure, again in 60 s (the old token stays in use meanwhile).
    /// Returns when JWT auth is off or the token carries no lifetime.
    pub async fn jwt_refresh_loop(self: std::sync::Arc<Self>) {
        loop {
            let Some(jwt) = self.current_jwt() else {
                return;
            };
            let Some(lifetime) = jwt.lifetime else { return };
            let factor = 0.45 + 0.1 * rand::random::<f64>();
            // An absurd lifetime (from the server's `exp − iat`) that overflows the clock
            // means the token never needs refreshing in this process.
            let Some(due) = refresh_due(jwt.received, lifetime, factor) else {
                return;
            };
            tokio::time::sleep_until(due.into()).await;
            loop {
                let result = {
                    let _g = self.jwt_refresh.lock().await;
                    self.exchange_jwt().await
                };
                match result {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!("JWT refresh failed, retrying in 60 s: {e}");
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                }
            }
        }
    }

    fn current_jwt(&self) -> Option<Jwt> {
        self.jwt.lock().ok().and_then(|g| g.clone())
    }

    /// The credential for a request: the API key, or the JWT (refreshed when ≤ 60 s remain).
    async fn credential(&self, raw_key: bool) -> Result<Secret> {
        if raw_key || !self.jwt_enabled.load(Ordering::SeqCst) {
            return Ok(self.api_key.clone());
        }
        let needs_refresh = match self.current_jwt() {
            None => true,
            Some(j) => j.exp.is_some_and(|exp| exp <= unix_now() + 60),
        };
        if needs_refresh {
            let _g = self.jwt_refresh.lock().await;
            let still = match self.current_jwt() {
                None => true,
                Some(j) => j.exp.is_some_and(|exp| exp <= unix_now() + 60),
            };
            if still && let Err(e) = self.exchange_jwt().await {
                // Keep using the old token until it actually expires.
                match self.current_jwt() {
                    Some(j) if j.exp.is_none_or(|exp| exp > unix_now()) => {
                        tracing::warn!("JWT refresh failed, keeping the current token: {e}");
                    }
                    _ => return Err(e),
                }
            }
        }
        self.current_jwt()
            .map(|j| j.token)
            .ok_or_else(|| Error::Backend("no JWT after the token exchange".into()))
    }

    /// The URL of the endpoint `path` (below `/api/v1/`), parsed once per path.
    fn url(&self, path: &str) -> Result<reqwest::Url> {
        let mut urls = self
            .urls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(url) = urls.get(path) {
            return Ok(url.clone());
        }
        let text = format!("{}/api/v1/{path}", self.base_url);
        let url = reqwest::Url::parse(&text)
            .map_err(|e| Error::config("base_url", format!("`{text}` is not a URL: {e}")))?;
        if urls.len() < URL_CACHE_MAX {
            urls.insert(path.to_string(), url.clone());
        }
        Ok(url)
    }

    /// One attempt's request: `call`'s method at `url`, with `headers`, its timeout and
    /// `body`. The builder makes the request (a URL's credentials become basic
    /// authentication, as with `RequestBuilder::send`); the header map is then moved in
    /// whole, where the builder's `headers` would insert each header again into the
    /// request's own map (the same headers in the same order).
    fn request(
        &self,
        call: &Call,
        url: &reqwest::Url,
        headers: HeaderMap,
        body: Option<&Bytes>,
    ) -> reqwest::Result<reqwest::Request> {
        let mut req = self
            .client
            .request(call.method.clone(), url.clone())
            .build()?;
        if req.headers().is_empty() {
            *req.headers_mut() = headers;
        } else {
            req.headers_mut().extend(headers);
        }
        *req.timeout_mut() = Some(call.timeout);
        if let Some(b) = body {
            *req.body_mut() = Some(b.clone().into());
        }
        Ok(req)
    }

    /// Sends `call` with HTTP-layer retries and returns the final response, whatever its
    /// status. Transport failures after the retry budget become [`Error::Transport`].
    pub async fn send_raw(&self, call: &Call) -> Result<RawResponse> {
        let url = self.url(&call.path)?;
        // A version-4 UUID as the SDK's, from the thread's CSPRNG (seeded from the operating
        // system, like `uuid::Uuid::new_v4`, but without a `getrandom` system call per request).
        let idempotency_key = format!(
            "stainless-python-retry-{}",
            uuid::Builder::from_random_bytes(rand::random()).into_uuid()
        );
        let mut retries_taken: u32 = 0;
        let mut jwt_replayed = false;
        let mut empty_400s = 0u32;
        let body_bytes: Option<Bytes> = match &call.body {
            Body::None => None,
            Body::Json(b) => Some(b.clone()),
            Body::Proto { bytes, zstd: false } => Some(bytes.clone()),
            Body::Proto { bytes, zstd: true } => Some(
                zstd::encode_all(&bytes[..], 3)
                    .map_err(|e| Error::Backend(format!("zstd compression: {e}")))?
                    .into(),
            ),
        };
        loop {
            let credential = self.credential(call.raw_key).await?;
            // In the SDK's order. Constant values are `HeaderValue::from_static` (no copy);
            // text goes through `insert_text`, which checks it.
            let mut headers = HeaderMap::with_capacity(12);
            headers.insert(header::ACCEPT, HeaderValue::from_static(call.accept));
            let content_type = match &call.body {
                Body::None => None,
                Body::Json(_) => Some("application/json"),
                Body::Proto { .. } => Some("application/x-protobuf"),
            };
            if let Some(t) = content_type {
                headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
            }
            if let Body::Proto { zstd: true, .. } = &call.body {
                headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("zstd"));
            }
            if let Some(m) = call.sdk_method {
                headers.insert(
                    HeaderName::from_static("x-sdk-version"),
                    HeaderValue::from_static(SDK_VERSION),
                );
                headers.insert(
                    HeaderName::from_static("x-sdk-method"),
                    HeaderValue::from_static(m),
                );
            }
            for (n, v) in &call.headers {
                let name = HeaderName::from_bytes(n.as_bytes())
                    .map_err(|e| Error::Backend(format!("header name {n}: {e}")))?;
                insert_text(&mut headers, name, v)?;
            }
            if call.method != Method::GET {
                insert_text(
                    &mut headers,
                    HeaderName::from_static("x-idempotency-key"),
                    &idempotency_key,
                )?;
            }
            headers.insert(
                HeaderName::from_static("x-stainless-retry-count"),
                HeaderValue::from(retries_taken),
            );
            insert_text(
                &mut headers,
                HeaderName::from_static("x-stainless-read-timeout"),
                &format_secs(call.timeout),
            )?;
            let mut key = HeaderValue::from_str(credential.expose()).map_err(|_| {
                Error::config(
                    "TINKER_API_KEY",
                    "contains characters not allowed in a header",
                )
            })?;
            key.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), key);

            let sent = match self.request(call, &url, headers, body_bytes.as_ref()) {
                Ok(req) => self.client.execute(req).await,
                Err(e) => Err(e),
            };
            let outcome = match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let headers = resp.headers().clone();
                    match resp.bytes().await {
                        // A 400 with an empty body is a proxy's rejection (Cloudflare), not
                        // the server's answer: the SDK treats it as a connection error.
                        Ok(b) if status == 400 && b.is_empty() && empty_400s < 16 => {
                            empty_400s += 1;
                            Err("empty 400 response (proxy rejection)".to_string())
                        }
                        // A 2xx JSON answer that is not JSON at all was garbled on the way
                        // (a proxy, a cut connection): like a connection error, resent with
                        // the same idempotency key, so the server answers it once more without
                        // applying it again. JSON of the wrong shape is the caller's `Decode`.
                        Ok(b) if (200..300).contains(&status) && garbled_json(&headers, &b) => {
                            Err(format!(
                                "garbled JSON response body ({} bytes): {}",
                                b.len(),
                                String::from_utf8_lossy(&b[..b.len().min(200)])
                            ))
                        }
                        Ok(b) => Ok(RawResponse {
                            status,
                            headers,
                            body: b,
                        }),
                        Err(e) => Err(strip_url(&e)),
                    }
                }
                Err(e) => Err(strip_url(&e)),
            };
            match outcome {
                Err(e) => {
                    if retries_taken < call.max_retries {
                        let d = self.backoff(http_backoff(retries_taken));
                        tracing::debug!(
                            "{} {}: {e}; retrying in {d:?}",
                            call.method,
                            call.display()
                        );
                        tokio::time::sleep(d).await;
                        retries_taken += 1;
                        continue;
                    }
                    return Err(Error::Transport {
                        endpoint: call.display(),
                        message: e,
                    });
                }
                Ok(resp) => {
                    if resp.status == 401
                        && !call.raw_key
                        && !jwt_replayed
                        && self.jwt_enabled.load(Ordering::SeqCst)
                    {
                        let invalid = resp
                            .headers
                            .get("www-authenticate")
                            .and_then(|v| v.to_str().ok())
                            .is_some_and(|v| v.contains("invalid_token"));
                        if invalid {
                            jwt_replayed = true;
                            let _g = self.jwt_refresh.lock().await;
                            let same =
                                self.current_jwt().map(|j| j.token) == Some(credential.clone());
                            if same {
                                self.exchange_jwt().await?;
                            }
                            continue;
                        }
                    }
                    let forced = resp
                        .headers
                        .get("x-should-retry")
                        .and_then(|v| v.to_str().ok())
                        .map(|v| v.eq_ignore_ascii_case("true"));
                    let retry = match forced {
                        Some(f) => f,
                        None => is_retryable_status(resp.status),
                    };
                    if !(200..300).contains(&resp.status)
                        && retry
                        && retries_taken < call.max_retries
                    {
                        let d = retry_after(&resp.headers)
                            .unwrap_or_else(|| self.backoff(http_backoff(retries_taken)));
                        tracing::debug!(
                            "{} {} answered {}; retrying in {d:?}",
                            call.method,
                            call.display(),
                            resp.status
                        );
                        tokio::time::sleep(d).await;
                        retries_taken += 1;
                        continue;
                    }
                    return Ok(resp);
                }
            }
        }
    }

    /// Like [`send_raw`](Self::send_raw), but a non-2xx status is an [`Error::Http`].
    pub async fn send(&self, call: Call) -> Result<RawResponse> {
        let resp = self.send_raw(&call).await?;
        if (200..300).contains(&resp.status) {
            Ok(resp)
        } else {
            Err(Error::Http {
                method: call.method.to_string(),
                endpoint: call.display(),
                status: resp.status,
                body: resp.body_text(),
            })
        }
    }

    /// The SDK's holder-level retry loop around a whole call: connection errors and 408,
    /// 409, 429, 5xx are retried with `min(2^attempt, 30)` s back-off for up to 300 s; 402
    /// (billing) is waited out in 5 s steps for up to an hour. Each attempt is a fresh call
    /// (new idempotency key); the caller reuses its `seq_id`.
    pub async fn with_holder_retries<T, F, Fut>(&self, mut attempt_fn: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let start = Instant::now();
        let mut attempt: u32 = 0;
        let mut billing_since: Option<Instant> = None;
        let mut last_billing: Option<Instant> = None;
        loop {
            match attempt_fn().await {
                Ok(v) => return Ok(v),
                Err(Error::Http { status: 402, .. })
                    if billing_within_window(&mut billing_since, &mut last_billing) =>
                {
                    tokio::time::sleep(self.backoff(Duration::from_secs(5))).await;
                }
                Err(e) if is_holder_retryable(&e) => {
                    let delay = self.backoff(Duration::from_secs(2u64.pow(attempt.min(5)).min(30)));
                    if start.elapsed() + delay > Duration::from_secs(300) {
                        return Err(e);
                    }
                    tracing::debug!("retrying after {e} in {delay:?}");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Tracks the 402 window: true while 402s have persisted for less than an hour (the window
/// restarts after 300 s without one).
pub(crate) fn billing_within_window(
    since: &mut Option<Instant>,
    last: &mut Option<Instant>,
) -> bool {
    let now = Instant::now();
    if last.is_none_or(|l| now.duration_since(l) > Duration::from_secs(300)) {
        *since = Some(now);
    }
    *last = Some(now);
    since.is_some_and(|s| now.duration_since(s) < Duration::from_secs(3600))
}

/// Whether a response declared as JSON fails to parse as JSON of any shape.
fn garbled_json(headers: &HeaderMap, body: &[u8]) -> bool {
    let json = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    json && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_err()
}

/// Whether the holder loop retries `e`.
pub(crate) fn is_holder_retryable(e: &Error) -> bool {
    match e {
        Error::Transport { .. } => true,
        Error::Http { status, .. } => is_retryable_status(*status),
        _ => false,
    }
}

/// Seconds as Python prints a float/int timeout (`60`, `45`, `10`, `5.0` style is not needed).
fn format_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}

/// A reqwest error message without the URL's query (never includes headers or the key).
pub(crate) fn strip_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), u.path());
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbled_json_bodies_are_told_from_json_of_another_shape() {
        let mut json = HeaderMap::new();
        json.insert("content-type", HeaderValue::from_static("application/json"));
        assert!(garbled_json(&json, br#"{"request_id": {"req"#));
        assert!(garbled_json(&json, b"<html>502</html>"));
        assert!(garbled_json(&json, b""));
        // Valid JSON of an unexpected shape is the caller's decode error, not a retry.
        assert!(!garbled_json(&json, br#"{"request_id": 5}"#));
        assert!(!garbled_json(&json, b"[]"));
        // Non-JSON content types are not checked (protobuf results).
        let mut pb = HeaderMap::new();
        pb.insert(
            "content-type",
            HeaderValue::from_static("application/x-protobuf"),
        );
        assert!(!garbled_json(&pb, b"\x0a\x03"));
        assert!(!garbled_json(&HeaderMap::new(), b"not json"));
    }

    #[test]
    fn backoff_is_jittered_and_capped() {
        for k in 0..12 {
            let d = http_backoff(k).as_secs_f64();
            let base = (0.5 * 2f64.powi(k as i32)).min(10.0);
            assert!(d <= base && d >= 0.75 * base - 1e-9, "k={k} d={d}");
        }
    }

    #[test]
    fn retry_after_headers() {
        let mut h = HeaderMap::new();
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after", HeaderValue::from_static("120"));
        assert_eq!(retry_after(&h), None, "more than 60 s is ignored");
        h.insert(
            "retry-after",
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert_eq!(retry_after(&h), None, "a date in the past is ignored");
        assert_eq!(
            httpdate_to_unix("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        // Out-of-range fields are not dates (and never overflow).
        for bad in [
            "Sun, 06 Nov 9223372036854775807 08:49:37 GMT",
            "Sun, 06 Nov -9223372036854775808 08:49:37 GMT",
            "Sun, 9223372036854775807 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 9223372036854775807:49:37 GMT",
            "Sun, 06 Nov 1994 08:-1:37 GMT",
        ] {
            assert_eq!(httpdate_to_unix(bad), None, "{bad}");
            h.insert("retry-after", HeaderValue::from_str(bad).unwrap());
            assert_eq!(retry_after(&h), None, "{bad}");
        }
    }

    #[test]
    fn absurd_jwt_lifetime_does_not_overflow_the_clock() {
        let now = Instant::now();
        // `Instant + Duration` would panic here; the due time is simply unrepresentable.
        assert_eq!(refresh_due(now, u64::MAX, 0.55), None);
        assert_eq!(
            refresh_due(now, 3600, 0.5),
            Some(now + Duration::from_secs(1800))
        );
    }

    #[test]
    fn jwt_exp_claim() {
        // {"alg":"none"}.{"exp":1795982301,"iat":1795978701}
        let t = "eyJhbGciOiJub25lIn0.eyJleHAiOjE3OTU5ODIzMDEsImlhdCI6MTc5NTk3ODcwMX0.c2ln";
        assert_eq!(jwt_exp(t), Some(1_795_982_301));
        assert_eq!(jwt_exp("garbage"), None);
    }
}
