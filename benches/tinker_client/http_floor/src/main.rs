//! Client CPU per HTTP request on this machine, for two clients against one server:
//! `reqwest` configured as rlvr's Tinker backend configures it, and `hyper-util`'s pooled
//! client (the one reqwest wraps) without reqwest's per-request layers. Both send a small
//! JSON `POST` with four of the SDK's headers and read the whole answer; requests go
//! `--in-flight` at a time (16: a tutorial step's sample requests), on a current-thread
//! runtime, as `examples/tinker_bench.rs` runs. Rounds alternate between the clients; the
//! medians of the rounds are printed, CPU (user + system, from `getrusage`) and system CPU
//! per request.
//!
//!     http-floor --url http://127.0.0.1:8799/api/v1/healthz [--requests 3200] [--rounds 6]
//!                [--in-flight 16]

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

const BODY: &[u8] =
    br#"{"request_id":"00000000-0000-0000-0000-000000000000","allow_metadata_only":true}"#;

/// (user + system, system) CPU seconds of this process so far.
fn cpu() -> (f64, f64) {
    // SAFETY: `getrusage` fills the struct it is given; all-zero bytes are a valid `rusage`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a live `rusage`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (s(ru.ru_utime) + s(ru.ru_stime), s(ru.ru_stime))
}

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

// Two values, built once: their sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Client {
    Reqwest(reqwest::Client, reqwest::Url),
    Hyper(
        hyper_util::client::legacy::Client<
            hyper_util::client::legacy::connect::HttpConnector,
            Full<Bytes>,
        >,
        http::Uri,
    ),
}

impl Client {
    async fn one(&self) -> usize {
        let timeout = Duration::from_secs(60);
        match self {
            Client::Reqwest(c, url) => {
                let resp = c
                    .post(url.clone())
                    .header("accept", "application/json")
                    .header("content-type", "application/json")
                    .header("x-stainless-retry-count", "0")
                    .header("x-api-key", "tml-bench")
                    .timeout(timeout)
                    .body(Bytes::from_static(BODY))
                    .send()
                    .await
                    .expect("reqwest request");
                assert!(resp.status().is_success(), "{url}: {}", resp.status());
                // As rlvr's `Http::send_raw` does: the headers outlive the consumed response.
                let _headers = resp.headers().clone();
                resp.bytes().await.expect("reqwest body").len()
            }
            Client::Hyper(c, uri) => {
                let req = http::Request::post(uri.clone())
                    .header("accept", "application/json")
                    .header("content-type", "application/json")
                    .header("x-stainless-retry-count", "0")
                    .header("x-api-key", "tml-bench")
                    .body(Full::new(Bytes::from_static(BODY)))
                    .expect("request");
                let resp = tokio::time::timeout(timeout, c.request(req))
                    .await
                    .expect("timeout")
                    .expect("hyper request");
                assert!(resp.status().is_success(), "{uri}: {}", resp.status());
                let (_parts, body) = resp.into_parts();
                body.collect().await.expect("hyper body").to_bytes().len()
            }
        }
    }

    /// (CPU, system CPU) seconds per request over `n` requests, `in_flight` at a time.
    async fn round(&self, n: usize, in_flight: usize) -> (f64, f64) {
        let (c0, s0) = cpu();
        let mut done = 0;
        while done < n {
            let batch = in_flight.min(n - done);
            futures::future::join_all((0..batch).map(|_| self.one())).await;
            done += batch;
        }
        let (c1, s1) = cpu();
        ((c1 - c0) / n as f64, (s1 - s0) / n as f64)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = arg("--url", "http://127.0.0.1:8799/api/v1/healthz");
    let n: usize = arg("--requests", "3200").parse().expect("--requests N");
    let rounds: usize = arg("--rounds", "6").parse().expect("--rounds N");
    let in_flight: usize = arg("--in-flight", "16").parse().expect("--in-flight N");
    let reqwest_client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .retry(reqwest::retry::never().max_retries_per_request(0))
        .user_agent("rlvr/bench")
        .build()
        .expect("reqwest client");
    let clients = [
        (
            "reqwest 0.12 (rlvr's Tinker client)",
            Client::Reqwest(reqwest_client, url.parse().expect("URL")),
        ),
        (
            "hyper-util legacy client (no reqwest layers)",
            Client::Hyper(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http(),
                url.parse().expect("URI"),
            ),
        ),
    ];
    // Warm up: connections opened, code paged in.
    for (_, c) in &clients {
        c.round(in_flight * 4, in_flight).await;
    }
    let mut figures: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); clients.len()];
    for _ in 0..rounds {
        for ((_, c), f) in clients.iter().zip(&mut figures) {
            let (cpu, sys) = c.round(n, in_flight).await;
            f.0.push(cpu * 1e6);
            f.1.push(sys * 1e6);
        }
    }
    println!("client CPU per request, {rounds} alternating rounds of {n} requests, {in_flight} in flight ({url}):");
    for ((name, _), (cpu, sys)) in clients.iter().zip(&mut figures) {
        let (lo, hi) = (
            cpu.iter().copied().fold(f64::INFINITY, f64::min),
            cpu.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "  {name:46} {:6.1} µs (of it system {:5.1} µs; rounds {lo:.1}–{hi:.1})",
            median(cpu),
            median(sys)
        );
    }
}
