//! Client configuration: credentials, base URL, timeouts.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::error::{Error, Result};

/// The default Tinker service URL (the SDK's default, path prefix included).
pub const DEFAULT_BASE_URL: &str = "https://tinker.thinkingmachines.dev/services/tinker-prod";

/// The SDK version whose wire protocol this client speaks (sent as `sdk_version`).
pub const SDK_VERSION: &str = "0.38.0";

/// A secret string (API key or token). `Debug` and `Display` never show it.
///
/// ```
/// use rlvr::backend::tinker::Secret;
/// let s = Secret::new("tml-very-secret");
/// assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
/// assert_eq!(s.to_string(), "<redacted>");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    /// The secret itself; only for building request headers.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Configuration of a [`TinkerClient`](super::TinkerClient).
///
/// Resolution follows the SDK: explicit builder values, then the environment
/// (`TINKER_API_KEY`, `TINKER_BASE_URL`), then the default URL. The API key must start with
/// `tml-`. Plain `http://` URLs are refused unless the host is a loopback address or
/// [`allow_insecure_http`](Self::allow_insecure_http) is set.
///
/// ```
/// use rlvr::backend::tinker::TinkerConfig;
/// let c = TinkerConfig::new("tml-abc").unwrap().base_url("http://127.0.0.1:8000/");
/// assert_eq!(c.base_url_str(), "http://127.0.0.1:8000");
/// assert!(!format!("{c:?}").contains("tml-abc"));
/// assert!(TinkerConfig::new("sk-abc").is_err());
/// ```
#[derive(Clone, Debug)]
pub struct TinkerConfig {
    pub(crate) api_key: Secret,
    pub(crate) base_url: String,
    pub(crate) allow_insecure_http: bool,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_retries: u32,
    pub(crate) poll_timeout: Duration,
    pub(crate) backoff_scale: f64,
    pub(crate) tags: Vec<String>,
    pub(crate) project_id: Option<String>,
}

impl TinkerConfig {
    /// A configuration with an explicit API key (must start with `tml-`) and the base URL
    /// from `TINKER_BASE_URL` or the default.
    pub fn new(api_key: impl Into<String>) -> Result<Self> {
        let api_key = api_key.into();
        if !api_key.starts_with("tml-") {
            return Err(Error::config(
                "TINKER_API_KEY",
                "a Tinker API key starts with `tml-`",
            ));
        }
        let base_url = std::env::var("TINKER_BASE_URL")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let tags = std::env::var("TINKER_TAGS")
            .ok()
            .map(|t| {
                let mut v: Vec<String> = t
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                v.sort();
                v.dedup();
                v
            })
            .unwrap_or_default();
        let project_id = std::env::var("TINKER_PROJECT_ID")
            .ok()
            .filter(|s| !s.is_empty());
        Ok(TinkerConfig {
            api_key: Secret::new(api_key),
            base_url: trim_url(&base_url),
            allow_insecure_http: false,
            heartbeat_interval: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            max_retries: 10,
            poll_timeout: Duration::from_secs(45),
            backoff_scale: 1.0,
            tags,
            project_id,
        })
    }

    /// Reads the API key from `TINKER_API_KEY` (and the URL from `TINKER_BASE_URL`).
    pub fn from_env() -> Result<Self> {
        match std::env::var("TINKER_API_KEY") {
            Ok(k) if !k.is_empty() => Self::new(k),
            _ => Err(Error::config(
                "TINKER_API_KEY",
                "not set; export TINKER_API_KEY=tml-... (create a key in the Tinker console)",
            )),
        }
    }

    /// Sets the base URL (a trailing `/` is dropped).
    pub fn base_url(mut self, url: impl AsRef<str>) -> Self {
        self.base_url = trim_url(url.as_ref());
        self
    }

    /// Allows plain `http://` to non-loopback hosts (the API key then travels unencrypted).
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.allow_insecure_http = allow;
        self
    }

    /// Interval of the session heartbeat (the SDK's 10 s by default).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// HTTP-layer retry budget for calls that retry (the SDK's 10 by default).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Default per-request timeout (60 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Timeout of one `retrieve_future` long-poll (the SDK's 45 s). A poll that outlives it is
    /// simply sent again.
    pub fn poll_timeout(mut self, timeout: Duration) -> Self {
        self.poll_timeout = timeout;
        self
    }

    /// Multiplies every client-side retry and back-off delay (HTTP-layer back-off, the holder
    /// loop's `min(2^n, 30)` s, polling back-off, sampling back-pressure and retries, the
    /// 402 wait) by `scale`; 1.0 (the default) keeps the SDK's delays. A server's
    /// `Retry-After` is honoured as sent. Meant for tests against local servers; negative or
    /// non-finite values count as 1.0.
    pub fn backoff_scale(mut self, scale: f64) -> Self {
        self.backoff_scale = if scale.is_finite() && scale >= 0.0 {
            scale
        } else {
            1.0
        };
        self
    }

    /// Session tags sent with `create_session` (default: `TINKER_TAGS`, comma separated).
    pub fn tags(mut self, tags: Vec<String>) -> Self {
        self.tags = tags;
        self
    }

    /// Project id sent with `create_session` (default: `TINKER_PROJECT_ID`).
    pub fn project_id(mut self, project_id: Option<String>) -> Self {
        self.project_id = project_id;
        self
    }

    /// The base URL requests go to.
    pub fn base_url_str(&self) -> &str {
        &self.base_url
    }

    /// Checks the URL: a valid `http(s)` URL, and TLS unless the host is loopback or
    /// insecure HTTP was allowed.
    pub(crate) fn validate(&self) -> Result<()> {
        let url = reqwest::Url::parse(&self.base_url)
            .map_err(|e| Error::config("TINKER_BASE_URL", format!("`{}`: {e}", self.base_url)))?;
        match url.scheme() {
            "https" => Ok(()),
            "http" => {
                let host = url.host_str().unwrap_or("");
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let loopback = host.eq_ignore_ascii_case("localhost")
                    || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
                if loopback || self.allow_insecure_http {
                    Ok(())
                } else {
                    Err(Error::config(
                        "TINKER_BASE_URL",
                        format!(
                            "`{}` is plain http to a non-loopback host; the API key would be sent unencrypted (use https, or allow_insecure_http(true))",
                            self.base_url
                        ),
                    ))
                }
            }
            other => Err(Error::config(
                "TINKER_BASE_URL",
                format!("unsupported scheme `{other}` (expected https or http)"),
            )),
        }
    }
}

fn trim_url(s: &str) -> String {
    s.trim().trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_http_refused_for_remote_hosts() {
        let c = TinkerConfig::new("tml-x")
            .unwrap()
            .base_url("http://example.com/api");
        assert!(c.validate().is_err());
        assert!(c.clone().allow_insecure_http(true).validate().is_ok());
        for ok in [
            "http://127.0.0.1:1",
            "http://localhost:8000",
            "http://[::1]:9",
            "https://example.com",
        ] {
            assert!(
                TinkerConfig::new("tml-x")
                    .unwrap()
                    .base_url(ok)
                    .validate()
                    .is_ok(),
                "{ok}"
            );
        }
        assert!(
            TinkerConfig::new("tml-x")
                .unwrap()
                .base_url("ftp://x")
                .validate()
                .is_err()
        );
    }

    #[test]
    fn key_is_redacted_everywhere() {
        let c = TinkerConfig::new("tml-super-secret-key").unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("super-secret"), "{dbg}");
        assert_eq!(c.api_key.expose(), "tml-super-secret-key");
    }
}
