//! Interoperability with a Tinker-compatible server nobody on this project wrote: SkyRL's
//! implementation of the Tinker API, on CPU with a tiny Qwen3 model (`scripts/peer/`).
//!
//! Besides the backend calls one by one, it runs a real `GrpoTrainer` loop of 3 steps.
//!
//! Opt-in: set `RLVR_PEER_TESTS=1` after `bash scripts/peer/install.sh` (`.ci/run` does
//! both). Without it the test prints that it was skipped and passes. `RLVR_PEER_HOME`
//! points at the installation (default `~/.cache/rlvr-peer`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rlvr::backend::tinker::{TinkerClient, TinkerConfig};
use rlvr::{GrpoTrainer, TrainerConfig};
use rlvr::{
    PolicyBackend, RoleColon, Sampler,
    dataset::Problem,
    types::{
        AdamParams, Datum, LoraConfig, LossFn, ModelInput, SamplingParams, StopCondition,
        TensorData,
    },
};

/// The peer server's process group, terminated on drop (also when the test fails).
struct PeerServer {
    child: Child,
    log: PathBuf,
    _state: tempfile::TempDir,
}

impl PeerServer {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        let pgid = self.child.id();
        let signal = |sig: &str| {
            let _ = Command::new("kill")
                .args([sig, "--", &format!("-{pgid}")])
                .status();
        };
        signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        signal("-KILL");
        let _ = self.child.wait();
    }
}

fn peer_home() -> PathBuf {
    match std::env::var_os("RLVR_PEER_HOME") {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/rlvr-peer"),
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

async fn start_peer() -> (PeerServer, String) {
    use std::os::unix::process::CommandExt;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/peer/start.sh");
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = state.path().join("server.log");
    let out = std::fs::File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new("bash")
        .arg(&script)
        .env("PORT", port.to_string())
        .env("STATE_DIR", state.path().join("state"))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .expect("starting scripts/peer/start.sh");
    let mut server = PeerServer {
        child,
        log,
        _state: state,
    };
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("peer server exited with {status}:\n{}", server.log_tail());
        }
        let ready = http
            .get(format!("{url}/api/v1/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        if Instant::now() > deadline {
            panic!("peer server not ready after 120 s:\n{}", server.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (server, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_works_against_the_peer_server() {
    if std::env::var("RLVR_PEER_TESTS").as_deref() != Ok("1") {
        println!(
            "skipped: set RLVR_PEER_TESTS=1 (after scripts/peer/install.sh) to run the peer test"
        );
        return;
    }
    let model = peer_home().join("tiny-model");
    assert!(
        model.join("config.json").is_file(),
        "{} missing: run scripts/peer/install.sh",
        model.display()
    );
    let model = model.to_str().unwrap().to_string();
    let (server, url) = start_peer().await;

    let run = async {
        let config = TinkerConfig::new("tml-peer-test")?.base_url(&url);
        let client = TinkerClient::connect(config).await?;
        // The tokenizer comes from the model directory's tokenizer.json.
        let backend = client
            .create_lora_training(&model, LoraConfig::new(8))
            .await?;
        let tok = backend.tokenizer().clone();
        let prompt = ModelInput::from_tokens(tok.encode("User: What is 2+2?\n\nAssistant:")?);
        let params = SamplingParams::default()
            .max_tokens(8)
            .seed(1)
            .stop(StopCondition::Strings(vec!["\n\nUser:".into()]));

        let mut sampler = backend.sampler().await?;
        for step in 0..2 {
            let seqs = sampler.sample(&prompt, 4, &params).await?;
            assert_eq!(seqs.len(), 4);
            let mut data = Vec::new();
            for (i, s) in seqs.iter().enumerate() {
                assert!(!s.tokens.is_empty() && s.tokens.len() <= 8);
                assert_eq!(s.tokens.len(), s.logprobs.len());
                assert!(s.logprobs.iter().all(|lp| lp.is_finite() && *lp <= 0.0));
                let p = prompt.to_tokens();
                let all: Vec<u32> = p.iter().chain(&s.tokens).copied().collect();
                let n = all.len() - 1;
                let ob = p.len() - 1;
                let adv = if i % 2 == 0 { 1.0 } else { -1.0 };
                let mut lps = vec![0.0; ob];
                lps.extend(&s.logprobs);
                data.push(
                    Datum::new(ModelInput::from_tokens(all[..n].to_vec()))
                        .with_input(
                            "target_tokens",
                            TensorData::i64(all[1..].iter().map(|&t| t as i64).collect()),
                        )
                        .with_logprobs(lps)
                        .with_input(
                            "advantages",
                            TensorData::f32(
                                (0..n).map(|j| if j < ob { 0.0 } else { adv }).collect(),
                            ),
                        ),
                );
            }
            let fb = backend
                .forward_backward(data, LossFn::ImportanceSampling)
                .await?;
            let opt = backend
                .optim_step(AdamParams {
                    learning_rate: 1e-3,
                    ..AdamParams::default()
                })
                .await?;
            let fb = fb.await?;
            assert_eq!(fb.loss_fn_outputs.len(), 4);
            for (out, s) in fb.loss_fn_outputs.iter().zip(&seqs) {
                let lp = out["logprobs"].to_f32_vec();
                assert_eq!(lp.len(), prompt.len() + s.tokens.len() - 1);
            }
            let opt = opt.await?;
            println!(
                "peer step {step}: fwd/bwd metrics {:?}, optim metrics {:?}",
                fb.metrics, opt.metrics
            );
            sampler = backend.sampler().await?;
        }

        let lps = sampler.compute_logprobs(&prompt).await?;
        assert_eq!(lps.len(), prompt.len());
        assert!(lps[0].is_none() && lps[1..].iter().all(|l| l.is_some_and(|v| v <= 0.0)));

        let ckpt = backend.save_state("peer-ckpt").await?;
        assert!(ckpt.path.starts_with("tinker://"), "{}", ckpt.path);
        // The peer answers the one-request load with 422; the backend falls back.
        backend.load_state(&ckpt).await?;
        let after = backend.sampler().await?.sample(&prompt, 2, &params).await?;
        assert_eq!(after.len(), 2);

        let reference = backend.reference_sampler().await?;
        assert_eq!(reference.sample(&prompt, 1, &params).await?.len(), 1);

        // A real GRPO loop on the peer: rollouts, grading, pipelined fwd/bwd + optim_step,
        // new samplers every step, a checkpoint mid-run and at the end.
        let run_dir = tempfile::tempdir().map_err(|e| rlvr::Error::io("creating", "tempdir", e))?;
        let problems: Vec<Problem> = (0..4)
            .map(|i| {
                Problem::new(
                    format!("p{i}"),
                    format!("What is {i}+{i}?"),
                    format!("{}", 2 * i),
                )
            })
            .collect();
        // Random tiny model: reward completions of even length, which mixes most groups.
        let reward = |_: &Problem, text: &str| text.len().is_multiple_of(2) as u8 as f64;
        let config = TrainerConfig::builder()
            .batch_size(2)
            .group_size(4)
            .max_tokens(8)
            .learning_rate(1e-3)
            .keep_degenerate_groups(true)
            .max_steps(3)
            .save_every(2)
            .progress(false)
            .log_dir(run_dir.path())
            .build()?;
        let renderer = Arc::new(RoleColon::new(tok.clone()));
        let summary = GrpoTrainer::new(backend, reward, renderer, Arc::new(problems), config)?
            .run()
            .await?;
        assert_eq!(summary.steps_run, 3);
        let last = summary.last_step.expect("a last step");
        assert_eq!(last.datums, 8, "every group trains (degenerate ones kept)");
        println!(
            "peer GRPO step {}: reward {:.3}, degenerate {:.2}, datums {}",
            last.step, last.reward_mean, last.frac_degenerate, last.datums
        );
        let ckpt = summary.final_checkpoint.expect("a final checkpoint");
        assert!(ckpt.path.starts_with("tinker://"), "{}", ckpt.path);
        let rows = std::fs::read_to_string(run_dir.path().join("metrics.jsonl"))
            .map_err(|e| rlvr::Error::io("reading", "metrics.jsonl", e))?;
        assert_eq!(rows.lines().count(), 3);
        client.close().await?;
        Ok::<_, rlvr::Error>(())
    };
    let result = tokio::time::timeout(Duration::from_secs(600), run).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!(
            "peer test failed: {e}\n--- server log ---\n{}",
            server.log_tail()
        ),
        Err(_) => panic!(
            "peer test timed out\n--- server log ---\n{}",
            server.log_tail()
        ),
    }
    drop(server);
}
