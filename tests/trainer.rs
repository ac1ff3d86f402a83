//! The GRPO trainer driven by a scripted backend: advantages, exact datums, pipelining,
//! degenerate groups, reward failures, metrics rows, run directory, resume.

#[path = "common/scripted.rs"]
mod scripted;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rlvr::trainer::{GrpoTrainer, TrainerConfig};
use rlvr::{Dataset, Problem, Response, Reward, RewardError, RewardFn};
use scripted::{ByteRenderer, Event, Scripted, ScriptedBackend};

/// Reward: 1 when the text equals the answer (`correct` component); answers `"panic"` and
/// `"slow"` make the grader panic or hang; `"err"` makes it fail.
struct Exact;

#[async_trait]
impl RewardFn for Exact {
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError> {
        match problem.answer.as_str() {
            "panic" => panic!("grader exploded"),
            "slow" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Reward::new(1.0))
            }
            "err" => Err(RewardError::Failed("no answer".into())),
            answer => {
                let correct = if response.text == answer { 1.0 } else { 0.0 };
                let format = if response.termination.is_stop_sequence() {
                    1.0
                } else {
                    0.0
                };
                Ok(Reward::new(correct)
                    .with("correct", correct)
                    .with("format", format))
            }
        }
    }
}

fn problems(pairs: &[(&str, &str)]) -> Arc<dyn Dataset> {
    Arc::new(
        pairs
            .iter()
            .enumerate()
            .map(|(i, (q, a))| Problem::new(format!("p{i}"), *q, *a))
            .collect::<Vec<_>>(),
    )
}

fn script(entries: &[(&str, Vec<Scripted>)]) -> HashMap<String, Vec<Scripted>> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn base_config() -> rlvr::trainer::TrainerConfigBuilder {
    TrainerConfig::builder()
        .batch_size(2)
        .group_size(2)
        .shuffle(false)
        .max_tokens(8)
        .progress(false)
}

/// Problem "a" (answer "x") gets completions "x" and "z": rewards [1, 0]. Problem "b"
/// (answer "y") gets "y" twice: a degenerate group.
fn hand_case() -> ScriptedBackend {
    ScriptedBackend::new(script(&[
        (
            "a>",
            vec![
                Scripted::new("x", &[-0.5, -0.25]),
                Scripted::new("z", &[-1.0, -0.125]),
            ],
        ),
        ("b>", vec![Scripted::new("y", &[-0.5, -0.5])]),
    ]))
}

#[tokio::test]
async fn hand_computed_datums_and_advantages() {
    let backend = hand_case();
    let config = base_config().build().unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config,
    )
    .unwrap();
    let m = trainer.step().await.unwrap();

    let calls = backend.datums();
    assert_eq!(calls.len(), 1, "one forward_backward call");
    let data = &calls[0];
    assert_eq!(data.len(), 2, "the degenerate group is skipped");
    // prompt "a>" = [97, 62]; completion "x" + stop = [120, 0]; A = 1 − 0.5 = 0.5.
    let d = &data[0];
    assert_eq!(d.model_input.to_tokens(), vec![97, 62, 120]);
    assert_eq!(
        d.input("target_tokens").unwrap().as_i64().unwrap(),
        &[62, 120, 0]
    );
    assert_eq!(
        d.input("logprobs").unwrap().as_f32().unwrap(),
        &[0.0, -0.5, -0.25]
    );
    assert_eq!(
        d.input("advantages").unwrap().as_f32().unwrap(),
        &[0.0, 0.5, 0.5]
    );
    assert_eq!(d.loss_fn_inputs.len(), 3, "no mask is sent");
    // Completion "z": A = 0 − 0.5.
    let d = &data[1];
    assert_eq!(d.model_input.to_tokens(), vec![97, 62, 122]);
    assert_eq!(
        d.input("target_tokens").unwrap().as_i64().unwrap(),
        &[62, 122, 0]
    );
    assert_eq!(
        d.input("logprobs").unwrap().as_f32().unwrap(),
        &[0.0, -1.0, -0.125]
    );
    assert_eq!(
        d.input("advantages").unwrap().as_f32().unwrap(),
        &[0.0, -0.5, -0.5]
    );

    // Rewards [1, 0, 1, 1].
    assert_eq!(m.step, 0);
    assert_eq!(m.reward_mean, 0.75);
    assert_eq!(m.correct, Some(0.75));
    assert_eq!(m.format, Some(1.0));
    assert_eq!(m.frac_degenerate, 0.5);
    assert_eq!(m.datums, 2);
    assert_eq!(m.sampled_tokens, 8);
    assert_eq!(m.reward_failures, 0);
    let v = &m.values;
    assert_eq!(v["env/all/by_group/frac_mixed"], 0.5);
    assert_eq!(v["env/all/by_group/frac_all_good"], 0.5);
    assert_eq!(v["env/all/by_group/frac_all_bad"], 0.0);
    assert_eq!(v["env/all/ac_tokens_per_turn"], 2.0);
    assert_eq!(v["tokens/trained"], 6.0);
    assert_eq!(v["progress/done_frac"], 1.0);
    assert_eq!(v["optim/lr"], 4e-5);
    assert_eq!(v["optim/loss:sum"], 1.5);
    // The learner's logprobs are the sampler's − 0.25 on 4 action tokens.
    assert!((v["optim/kl_sample_train_v1"] - 0.25).abs() < 1e-9);
    assert!((v["optim/kl_sample_train_v2"] - 0.5 * 0.0625).abs() < 1e-9);
    // Entropy: −mean of every sampled logprob.
    let lps = [-0.5, -0.25, -1.0, -0.125, -0.5, -0.5, -0.5, -0.5];
    assert!((v["optim/entropy"] + lps.iter().sum::<f64>() / 8.0).abs() < 1e-9);
    assert_eq!(trainer.state().next_step, 1);
}

#[tokio::test]
async fn pipelined_submission_order() {
    let backend = hand_case();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        base_config().build().unwrap(),
    )
    .unwrap();
    trainer.step().await.unwrap();
    let events: Vec<Event> = backend
        .events()
        .into_iter()
        .filter(|e| !matches!(e, Event::Sample { .. }))
        .collect();
    assert_eq!(
        events,
        vec![
            Event::NewSampler(0),
            Event::SubmitForwardBackward(2),
            Event::SubmitOptim,
            Event::AwaitForwardBackward,
            Event::AwaitOptim,
            Event::NewSampler(1),
        ]
    );
    // Both prompts sampled, each once (G samples in one call), from version 0.
    let samples: Vec<Event> = backend
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::Sample { .. }))
        .collect();
    assert_eq!(samples.len(), 2);
    assert!(samples.iter().all(|e| matches!(
        e,
        Event::Sample {
            version: 0,
            seed: Some(_)
        }
    )));
}

#[tokio::test]
async fn substeps_and_minibatches_pipeline_every_call() {
    // Three problems with mixed groups: 6 datums; 2 substeps × 2 minibatches.
    let backend = ScriptedBackend::new(script(&[
        (
            "a>",
            vec![
                Scripted::new("x", &[-1.0, -1.0]),
                Scripted::new("z", &[-1.0, -1.0]),
            ],
        ),
        (
            "b>",
            vec![
                Scripted::new("x", &[-1.0, -1.0]),
                Scripted::new("z", &[-1.0, -1.0]),
            ],
        ),
        (
            "c>",
            vec![
                Scripted::new("x", &[-1.0, -1.0]),
                Scripted::new("z", &[-1.0, -1.0]),
            ],
        ),
    ]));
    let config = base_config()
        .batch_size(3)
        .num_substeps(2)
        .num_minibatches(2)
        .build()
        .unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "x"), ("c", "x")]),
        config,
    )
    .unwrap();
    let m = trainer.step().await.unwrap();
    assert_eq!(m.datums, 6);
    assert_eq!(m.values["optim/updates"], 2.0);
    let events: Vec<Event> = backend
        .events()
        .into_iter()
        .filter(|e| !matches!(e, Event::Sample { .. } | Event::NewSampler(_)))
        .collect();
    use Event::*;
    // Chunks of 6 into 2: [3, 3]; each into 2 minibatches: [1, 2].
    assert_eq!(
        events,
        vec![
            SubmitForwardBackward(1),
            SubmitForwardBackward(2),
            SubmitOptim,
            SubmitForwardBackward(1),
            SubmitForwardBackward(2),
            SubmitOptim,
            AwaitForwardBackward,
            AwaitForwardBackward,
            AwaitForwardBackward,
            AwaitForwardBackward,
            AwaitOptim,
            AwaitOptim,
        ]
    );
    // Same datums, in order, as one big call.
    let flat: Vec<_> = backend.datums().into_iter().flatten().collect();
    let single = hand_datums_single_call(&[("a", "x"), ("b", "x"), ("c", "x")]).await;
    assert_eq!(flat, single);
}

async fn hand_datums_single_call(ps: &[(&str, &str)]) -> Vec<rlvr::Datum> {
    let backend = ScriptedBackend::new(script(&[
        (
            "a>",
            vec![
                Scripted::new("x", &[-1.0, -1.0]),
                Scripted::new("z", &[-1.0, -1.0]),
            ],
        ),
        (
            "b>",
            vec![
                Scripted::new("x", &[-1.0, -1.0]),
                Scripted::new("z", &[-1.0, -1.0]),
            ],
        ),
        (
            "c>",
            vec![
                Scripted::new("x", &[-1.0, -1.0]),
                Scripted::new("z", &[-1.0, -1.0]),
            ],
        ),
    ]));
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(ps),
        base_config().batch_size(ps.len()).build().unwrap(),
    )
    .unwrap();
    trainer.step().await.unwrap();
    backend.datums().into_iter().flatten().collect()
}

#[tokio::test]
async fn degenerate_groups_kept_on_request() {
    let backend = hand_case();
    let config = base_config().keep_degenerate_groups(true).build().unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config,
    )
    .unwrap();
    let m = trainer.step().await.unwrap();
    assert_eq!(m.datums, 4);
    assert_eq!(m.frac_degenerate, 0.5);
    let data = &backend.datums()[0];
    assert_eq!(
        data[2].input("advantages").unwrap().as_f32().unwrap(),
        &[0.0, 0.0, 0.0]
    );
}

#[tokio::test]
async fn all_degenerate_skips_the_update_but_logs() {
    let backend = hand_case();
    let dir = tempfile::tempdir().unwrap();
    let config = base_config().log_dir(dir.path()).build().unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("b", "y"), ("b", "q")]),
        config,
    )
    .unwrap();
    let m = trainer.step().await.unwrap();
    assert_eq!(m.datums, 0);
    assert_eq!(m.frac_degenerate, 1.0);
    assert_eq!(m.values["optim/updates"], 0.0);
    assert!(backend.datums().is_empty());
    assert!(!backend
        .events()
        .iter()
        .any(|e| matches!(e, Event::SubmitOptim)));
    let rows = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 1);
}

#[tokio::test]
async fn reward_failures_are_counted_not_fatal() {
    let backend = ScriptedBackend::new(script(&[]));
    let config = base_config()
        .batch_size(4)
        .reward_timeout_s(0.2)
        .build()
        .unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "panic"), ("b", "slow"), ("c", "err"), ("d", "?")]),
        config,
    )
    .unwrap();
    let m = trainer.step().await.unwrap();
    assert_eq!(m.reward_failures, 6);
    assert_eq!(m.values["reward_errors/panic"], 2.0);
    assert_eq!(m.values["reward_errors/timeout"], 2.0);
    assert_eq!(m.values["reward_errors/failed"], 2.0);
    // Failures score 0; "?" is correct: rewards [0,0,0,0,0,0,1,1].
    assert_eq!(m.reward_mean, 0.25);
    assert_eq!(
        m.correct,
        Some(1.0),
        "components only from successful grades"
    );
    // Every group is constant: no update.
    assert_eq!(m.datums, 0);
}

#[tokio::test]
async fn truncated_completions_can_be_masked() {
    let backend = ScriptedBackend::new(script(&[(
        "a>",
        vec![
            Scripted::new("x", &[-1.0, -1.0]),
            Scripted::truncated("zzzz"),
        ],
    )]));
    let config = base_config()
        .batch_size(1)
        .mask_truncated(true)
        .build()
        .unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x")]),
        config,
    )
    .unwrap();
    let m = trainer.step().await.unwrap();
    assert_eq!(m.datums, 1);
    assert_eq!(m.values["train/masked_truncated"], 1.0);
    assert_eq!(m.values["env/all/stop/length"], 0.5);
    // The truncated sample still counts in the mean: A = 1 − 0.5.
    let d = &backend.datums()[0][0];
    assert_eq!(
        d.input("advantages").unwrap().as_f32().unwrap(),
        &[0.0, 0.5, 0.5]
    );
}

#[tokio::test]
async fn kl_penalty_is_folded_into_advantages() {
    let backend = hand_case(); // reference logprob −1.0 everywhere
    let config = base_config().kl_penalty_coef(0.5).build().unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config,
    )
    .unwrap();
    let m = trainer.step().await.unwrap();
    // d = lp − (−1): [0.5, 0.75] and [0, 0.875]; avg = 2.125 / 4.
    let avg = 2.125 / 4.0;
    assert!((m.values["kl_policy_base"] - avg).abs() < 1e-9);
    let data = &backend.datums()[0];
    let adv = data[0].input("advantages").unwrap().as_f32().unwrap();
    let want = [0.0, 0.5 + 0.5 * (avg - 0.5), 0.5 + 0.5 * (avg - 0.75)];
    for (a, w) in adv.iter().zip(want) {
        assert!((f64::from(*a) - w).abs() < 1e-6, "{adv:?} vs {want:?}");
    }
}

#[tokio::test]
async fn off_policy_zero_is_on_policy() {
    let ps = [("a", "x"), ("b", "y"), ("a", "x"), ("b", "y")];
    let run = |k: u64| async move {
        let backend = hand_case();
        let config = base_config()
            .max_steps(2)
            .max_steps_off_policy(k)
            .eval_every(0)
            .build()
            .unwrap();
        let mut trainer = GrpoTrainer::new(
            backend.clone(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&ps),
            config,
        )
        .unwrap();
        let mut rows = Vec::new();
        for _ in 0..2 {
            rows.push(trainer.step().await.unwrap());
        }
        (backend.events(), backend.datums(), rows)
    };
    let (e_default, d_default, _) = run(0).await;
    let backend = hand_case();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&ps),
        base_config().max_steps(2).eval_every(0).build().unwrap(),
    )
    .unwrap();
    trainer.step().await.unwrap();
    trainer.step().await.unwrap();
    assert_eq!(e_default, backend.events());
    assert_eq!(d_default, backend.datums());

    // One step off-policy: batch 1 is sampled by the version-0 sampler while step 0 trains.
    let (events, _, rows) = run(1).await;
    let versions: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Sample { version, .. } => Some(*version),
            _ => None,
        })
        .collect();
    assert_eq!(versions, vec![0, 0, 0, 0]);
    assert_eq!(rows[0].values["async/staleness_max"], 0.0);
    assert_eq!(rows[1].values["async/staleness_max"], 1.0);
}

fn read_rows(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn run_writes_the_run_directory_and_evaluates() {
    let backend = hand_case();
    let dir = tempfile::tempdir().unwrap();
    let config = base_config()
        .max_steps(3)
        .eval_every(2)
        .save_every(2)
        .log_dir(dir.path())
        .build()
        .unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config.clone(),
    )
    .unwrap()
    .with_eval_dataset(problems(&[("a", "x")]));
    let summary = trainer.run().await.unwrap();
    assert_eq!(summary.steps_run, 3);
    assert_eq!(summary.final_checkpoint.as_ref().unwrap().name, "final");

    let saved: TrainerConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved, config);
    let rows = read_rows(&dir.path().join("metrics.jsonl"));
    let steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(
        steps,
        vec![0, 1, 2, 3],
        "three steps and the final eval row"
    );
    // Eval at steps 0 and 2 (merged) and at the end (own row), one sample per problem:
    // "a" → "x" is correct.
    for i in [0, 2, 3] {
        assert_eq!(rows[i]["test/env/all/correct"], 1.0, "row {i}");
        assert_eq!(rows[i]["test/env/all/total_episodes"], 1.0, "row {i}");
    }
    assert!(rows[1].get("test/env/all/correct").is_none());
    assert!(rows[0].get("env/all/reward/total").is_some());
    assert!(rows[3].get("env/all/reward/total").is_none());
    // Per-step samples (JSONL + HTML) and the reward plot.
    let samples = read_rows(&dir.path().join("samples/000000.jsonl"));
    assert_eq!(samples.len(), 4);
    assert_eq!(samples[0]["problem_id"], "p0");
    assert_eq!(samples[0]["reward"], 1.0);
    assert_eq!(samples[0]["advantage"], 0.5);
    assert_eq!(samples[1]["advantage"], -0.5);
    assert_eq!(samples[0]["stop_reason"], "stop");
    assert_eq!(samples[0]["components"]["correct"], 1.0);
    for step in 0..3 {
        assert!(dir.path().join(format!("samples/{step:06}.html")).is_file());
    }
    assert!(dir.path().join("reward.png").is_file());
    assert!(dir.path().join("reward.svg").is_file());
    let ckpts = read_rows(&dir.path().join("checkpoints.jsonl"));
    let names: Vec<&str> = ckpts.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["000002", "final"]);
    assert_eq!(ckpts[0]["step"], 2);
    assert_eq!(ckpts[1]["step"], 3);
}

#[tokio::test]
async fn resume_continues_from_the_last_checkpoint() {
    let ps = [("a", "x"), ("b", "y"), ("c", "x"), ("d", "y")];
    let dir = tempfile::tempdir().unwrap();
    let config = base_config()
        .shuffle(true)
        .seed(3)
        .max_steps(4)
        .save_every(2)
        .eval_every(0)
        .log_dir(dir.path())
        .build()
        .unwrap();
    // Uninterrupted reference run.
    let reference = hand_case();
    let ref_dir = tempfile::tempdir().unwrap();
    let mut ref_config = config.clone();
    ref_config.log_dir = Some(ref_dir.path().to_path_buf());
    GrpoTrainer::new(
        reference.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&ps),
        ref_config,
    )
    .unwrap()
    .run()
    .await
    .unwrap();

    // Interrupted: a run that saved `000002` and logged step 2's row, then crashed (its
    // `final` record is dropped to simulate the crash).
    let mut short = config.clone();
    short.max_steps = Some(3);
    let first = hand_case();
    GrpoTrainer::new(
        first.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&ps),
        short,
    )
    .unwrap()
    .run()
    .await
    .unwrap();
    let ck = dir.path().join("checkpoints.jsonl");
    let text = std::fs::read_to_string(&ck).unwrap();
    let first_line = text.lines().next().unwrap().to_string();
    std::fs::write(&ck, first_line + "\n").unwrap();
    assert_eq!(read_rows(&dir.path().join("metrics.jsonl")).len(), 3);

    // Resume with a fresh backend process.
    let resumed = hand_case();
    let summary = GrpoTrainer::new(
        resumed.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&ps),
        config,
    )
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(summary.start_step, 2);
    assert_eq!(summary.steps_run, 2);
    assert_eq!(resumed.events()[0], Event::Load("000002".into()));
    let rows = read_rows(&dir.path().join("metrics.jsonl"));
    let steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(
        steps,
        vec![0, 1, 2, 3],
        "the row of step 2 from the crashed run was dropped"
    );
    // Same data order and sampling seeds: steps 2 and 3 repeat the reference run's.
    let seeds = |b: &ScriptedBackend| -> Vec<Option<u64>> {
        b.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Sample { seed, .. } => Some(seed),
                _ => None,
            })
            .collect()
    };
    let (ref_seeds, resumed_seeds) = (seeds(&reference), seeds(&resumed));
    assert_eq!(resumed_seeds.len(), 4);
    assert_eq!(resumed_seeds[..], ref_seeds[4..]);
    assert!(reference.datums().ends_with(&resumed.datums()));
    let ref_rows = read_rows(&ref_dir.path().join("metrics.jsonl"));
    assert_eq!(rows.len(), ref_rows.len());
    for (a, b) in rows.iter().zip(&ref_rows) {
        for key in [
            "env/all/reward/total",
            "train/datums",
            "tokens/cumulative/sampled",
        ] {
            assert_eq!(a[key], b[key], "{key} at step {}", a["step"]);
        }
    }
}

#[tokio::test]
async fn invalid_configs_are_rejected() {
    let err = GrpoTrainer::new(
        hand_case(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[]),
        base_config().build().unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, rlvr::Error::Config { ref field, .. } if field == "dataset"));
    let mut bad = base_config().build().unwrap();
    bad.num_substeps = 0;
    let err = GrpoTrainer::new(
        hand_case(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x")]),
        bad,
    )
    .unwrap_err();
    assert!(matches!(err, rlvr::Error::Config { ref field, .. } if field == "num_substeps"));
}

#[tokio::test]
async fn problem_env_path_matches_the_built_in_rollout() {
    use rlvr::trainer::ProblemEnvBuilder;
    let ps = [("a", "x"), ("b", "y")];
    let built_in = hand_case();
    let mut t = GrpoTrainer::new(
        built_in.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&ps),
        base_config().build().unwrap(),
    )
    .unwrap();
    let m1 = t.step().await.unwrap();

    let via_env = hand_case();
    let renderer: Arc<dyn rlvr::Renderer> = Arc::new(ByteRenderer);
    let builder = ProblemEnvBuilder::new(
        Arc::clone(&renderer),
        Arc::new(Exact),
        Duration::from_secs(5),
    );
    let mut t = GrpoTrainer::new(
        via_env.clone(),
        Exact,
        renderer,
        problems(&ps),
        base_config().build().unwrap(),
    )
    .unwrap()
    .with_env_builder(Arc::new(builder));
    let m2 = t.step().await.unwrap();

    assert_eq!(built_in.datums(), via_env.datums());
    assert_eq!(
        built_in.events(),
        via_env.events(),
        "same calls, seeds and order"
    );
    for key in [
        "env/all/reward/total",
        "env/all/correct",
        "env/all/format",
        "env/all/by_group/frac_mixed",
        "env/all/ac_tokens_per_turn",
        "env/all/ob_tokens_per_turn",
        "train/datums",
        "tokens/trained",
    ] {
        assert_eq!(m1.values[key], m2.values[key], "{key}");
    }
}

/// A two-turn guessing game: the model answers; a wrong first answer gets the feedback
/// `"no>"` appended to its context and one more try. Return: 1 for a first-try hit, 0.5 for
/// a second-try hit, 0 otherwise.
struct Guess {
    tries: u32,
    context: Vec<u32>,
}

#[async_trait]
impl rlvr::trainer::Env for Guess {
    async fn initial_observation(&mut self) -> rlvr::Result<rlvr::trainer::Observation> {
        Ok(rlvr::trainer::Observation {
            input: rlvr::ModelInput::from_tokens(self.context.clone()),
            stop: rlvr::StopCondition::Tokens(vec![0]),
        })
    }
    async fn step(
        &mut self,
        action: &rlvr::SampledSequence,
    ) -> rlvr::Result<rlvr::trainer::StepResult> {
        self.tries += 1;
        let hit = action.tokens.first() == Some(&u32::from(b'5'));
        let mut result = rlvr::trainer::StepResult {
            reward: if hit {
                1.0 / f64::from(self.tries)
            } else {
                0.0
            },
            done: hit || self.tries == 2,
            ..Default::default()
        };
        result.metrics.insert("turns".into(), f64::from(self.tries));
        if !result.done {
            self.context.extend(&action.tokens);
            self.context.extend(b"no>".iter().map(|&b| u32::from(b)));
            result.next = Some(rlvr::trainer::Observation {
                input: rlvr::ModelInput::from_tokens(self.context.clone()),
                stop: rlvr::StopCondition::Tokens(vec![0]),
            });
        }
        Ok(result)
    }
}

struct GuessBuilder;

impl rlvr::trainer::EnvBuilder for GuessBuilder {
    fn make_envs(
        &self,
        problem: Arc<Problem>,
        n: usize,
    ) -> rlvr::Result<Vec<Box<dyn rlvr::trainer::Env>>> {
        let mut context: Vec<u32> = problem.question.bytes().map(u32::from).collect();
        context.push(u32::from(b'>'));
        Ok((0..n)
            .map(|_| {
                Box::new(Guess {
                    tries: 0,
                    context: context.clone(),
                }) as Box<dyn rlvr::trainer::Env>
            })
            .collect())
    }
}

#[tokio::test]
async fn multi_turn_env_merges_turns_into_one_datum() {
    // First turn (shared call, G = 2): "3" and "5". The miss gets a second turn from the
    // extended context "g>3\0no>", where it answers "5".
    let backend = ScriptedBackend::new(script(&[
        (
            "g>",
            vec![
                Scripted::new("3", &[-1.0, -0.5]),
                Scripted::new("5", &[-0.25, -0.125]),
            ],
        ),
        ("g>3\0no>", vec![Scripted::new("5", &[-2.0, -0.75])]),
    ]));
    let mut t = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("g", "unused")]),
        base_config().batch_size(1).build().unwrap(),
    )
    .unwrap()
    .with_env_builder(Arc::new(GuessBuilder));
    let m = t.step().await.unwrap();
    // Returns [0.5, 1.0] → advantages [−0.25, 0.25].
    assert_eq!(m.reward_mean, 0.75);
    assert_eq!(m.values["env/all/turns"], 1.5);
    let data = &backend.datums()[0];
    assert_eq!(data.len(), 2);
    // Episode 1: "g>" + "3\0" + "no>" + "5\0" in one datum; "no>" is masked (advantage 0).
    let d = &data[0];
    let full: Vec<u32> = "g>3\0no>5\0".bytes().map(u32::from).collect();
    assert_eq!(d.model_input.to_tokens(), full[..full.len() - 1].to_vec());
    let targets: Vec<i64> = full[1..].iter().map(|&t| i64::from(t)).collect();
    assert_eq!(
        d.input("target_tokens").unwrap().as_i64().unwrap(),
        &targets[..]
    );
    assert_eq!(
        d.input("logprobs").unwrap().as_f32().unwrap(),
        &[0.0, -1.0, -0.5, 0.0, 0.0, 0.0, -2.0, -0.75]
    );
    let a = -0.25f32;
    assert_eq!(
        d.input("advantages").unwrap().as_f32().unwrap(),
        &[0.0, a, a, 0.0, 0.0, 0.0, a, a]
    );
    // Episode 2: a single turn.
    let d = &data[1];
    assert_eq!(d.model_input.to_tokens(), vec![103, 62, 53]);
    assert_eq!(
        d.input("advantages").unwrap().as_f32().unwrap(),
        &[0.0, 0.25, 0.25]
    );
    // Second-turn sampling: one completion from the extended context.
    let samples: Vec<Event> = backend
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::Sample { .. }))
        .collect();
    assert_eq!(samples.len(), 2);
}

struct CountingEval;

#[async_trait]
impl<S: rlvr::Sampler> rlvr::trainer::Evaluator<S> for CountingEval {
    fn name(&self) -> &str {
        "custom"
    }
    async fn evaluate(
        &self,
        sampler: &S,
        step: u64,
    ) -> rlvr::Result<std::collections::BTreeMap<String, f64>> {
        let out = sampler
            .sample(
                &rlvr::ModelInput::from_tokens(vec![97, 62]),
                2,
                &rlvr::SamplingParams::default(),
            )
            .await?;
        Ok([
            ("step".to_string(), step as f64),
            ("samples".to_string(), out.len() as f64),
        ]
        .into_iter()
        .collect())
    }
}

#[tokio::test]
async fn custom_evaluators_and_loss_choice() {
    let backend = hand_case();
    let dir = tempfile::tempdir().unwrap();
    let config = base_config()
        .max_steps(2)
        .eval_every(1)
        .loss(rlvr::LossFn::Cispo {
            clip_low_threshold: 0.5,
            clip_high_threshold: 2.0,
        })
        .eval(rlvr::trainer::EvalConfig {
            temperature: 0.0,
            ..Default::default()
        })
        .log_dir(dir.path())
        .build()
        .unwrap();
    let summary = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config,
    )
    .unwrap()
    .with_evaluator(CountingEval)
    .run()
    .await
    .unwrap();
    let final_eval = summary.final_eval.unwrap();
    assert_eq!(final_eval["custom/step"], 2.0);
    assert_eq!(final_eval["custom/samples"], 2.0);
    let rows = read_rows(&dir.path().join("metrics.jsonl"));
    assert_eq!(rows[0]["custom/step"], 0.0);
    assert_eq!(rows[1]["custom/step"], 1.0);
    let losses = backend.shared.lock().unwrap().losses.clone();
    assert_eq!(losses.len(), 2);
    assert!(losses.iter().all(|l| *l
        == rlvr::LossFn::Cispo {
            clip_low_threshold: 0.5,
            clip_high_threshold: 2.0
        }));
}
