//! The GRPO trainer driven by a scripted backend: advantages, exact datums, pipelining,
//! degenerate groups, reward failures, metrics rows, run directory, resume.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::scripted::{ByteRenderer, Event, Scripted, ScriptedBackend};
use async_trait::async_trait;
use rlvr::{
    Dataset, RewardFn,
    dataset::Problem,
    reward::{Response, Reward, RewardError},
};
use rlvr::{GrpoTrainer, TrainerConfig};

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
    assert_eq!(d.target_tokens().unwrap(), &[62, 120, 0]);
    assert_eq!(d.logprobs().unwrap(), &[0.0, -0.5, -0.25]);
    assert_eq!(d.advantages().unwrap(), &[0.0, 0.5, 0.5]);
    assert_eq!(d.loss_fn_inputs.len(), 3, "no mask is sent");
    // Completion "z": A = 0 − 0.5.
    let d = &data[1];
    assert_eq!(d.model_input.to_tokens(), vec![97, 62, 122]);
    assert_eq!(d.target_tokens().unwrap(), &[62, 122, 0]);
    assert_eq!(d.logprobs().unwrap(), &[0.0, -1.0, -0.125]);
    assert_eq!(d.advantages().unwrap(), &[0.0, -0.5, -0.5]);

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
    // Seeds fit in a non-negative int32, which every sampling engine accepts.
    assert!(samples.iter().all(|e| matches!(
        e,
        Event::Sample {
            version: 0,
            seed: Some(s),
            ..
        } if *s < 1 << 31
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

/// `loss_aggregation` weights each completion's loss terms by scaling its advantages:
/// `SequenceMean` by 1/|o_i|, `TokenMean` by 1/Σ|o_j| over the step's batch, `Constant(C)` by
/// 1/C (completions of 2, 4, 2 and 6 action tokens: 1 byte or more, and the stop token); with
/// streamed minibatches too.
#[tokio::test]
async fn loss_aggregation_weights_each_completion() {
    use rlvr::trainer::LossAggregation;
    async fn datums(agg: LossAggregation, stream: bool) -> Vec<rlvr::types::Datum> {
        let backend = ScriptedBackend::new(script(&[
            (
                "a>",
                vec![
                    Scripted::new("x", &[-1.0; 2]),
                    Scripted::new("zzz", &[-1.0; 4]),
                ],
            ),
            (
                "b>",
                vec![
                    Scripted::new("y", &[-1.0; 2]),
                    Scripted::new("wwwww", &[-1.0; 6]),
                ],
            ),
        ]));
        let mut config = base_config().loss_aggregation(agg);
        if stream {
            config = config.stream_minibatches(true).num_minibatches(2);
        }
        let mut trainer = GrpoTrainer::new(
            backend.clone(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&[("a", "x"), ("b", "y")]),
            config.build().unwrap(),
        )
        .unwrap();
        trainer.step().await.unwrap();
        let mut all: Vec<rlvr::types::Datum> = backend.datums().into_iter().flatten().collect();
        // Streamed minibatches arrive in completion order; compare by prompt.
        all.sort_by_key(|d| format!("{:?}", d.model_input));
        all
    }
    let sum = datums(LossAggregation::Sum, false).await;
    assert_eq!(sum.len(), 4);
    let tokens = |d: &rlvr::types::Datum| {
        d.advantages()
            .unwrap()
            .iter()
            .zip(d.logprobs().unwrap())
            .filter(|&(_, &l)| l != 0.0)
            .count() as f64
    };
    let lens: Vec<f64> = sum.iter().map(tokens).collect();
    let mut sorted = lens.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(sorted, vec![2.0, 2.0, 4.0, 6.0]);
    let batch: f64 = lens.iter().sum();
    type Weight = Box<dyn Fn(f64) -> f64>;
    let cases: [(LossAggregation, bool, Weight); 5] = [
        (LossAggregation::SequenceMean, false, Box::new(|n| 1.0 / n)),
        (LossAggregation::SequenceMean, true, Box::new(|n| 1.0 / n)),
        (
            LossAggregation::TokenMean,
            false,
            Box::new(move |_| 1.0 / batch),
        ),
        (
            LossAggregation::Constant(8.0),
            false,
            Box::new(|_| 1.0 / 8.0),
        ),
        (LossAggregation::Sum, true, Box::new(|_| 1.0)),
    ];
    for (agg, stream, weight) in cases {
        let got = datums(agg, stream).await;
        assert_eq!(got.len(), sum.len());
        for ((g, s), n) in got.iter().zip(&sum).zip(&lens) {
            let w = weight(*n) as f32;
            let want: Vec<f32> = s.advantages().unwrap().iter().map(|a| a * w).collect();
            assert_eq!(
                g.advantages().unwrap(),
                &want[..],
                "{agg:?} stream {stream}"
            );
        }
    }
    let bad = base_config()
        .loss_aggregation(LossAggregation::Constant(0.0))
        .build();
    assert!(bad.unwrap_err().to_string().contains("loss_aggregation"));
    let dro = base_config()
        .loss(rlvr::types::LossFn::dro())
        .loss_aggregation(LossAggregation::SequenceMean)
        .build();
    assert!(dro.unwrap_err().to_string().contains("dro"));
}

async fn hand_datums_single_call(ps: &[(&str, &str)]) -> Vec<rlvr::types::Datum> {
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
    assert_eq!(data[2].advantages().unwrap(), &[0.0, 0.0, 0.0]);
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
    assert!(
        !backend
            .events()
            .iter()
            .any(|e| matches!(e, Event::SubmitOptim))
    );
    let rows = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 1);
}

#[tokio::test]
async fn reward_failures_are_counted_not_fatal() {
    let backend = ScriptedBackend::new(script(&[]));
    let config = base_config()
        .batch_size(4)
        // Generous: under a loaded CI machine, a panicking grader's thread must still report
        // its panic before the timeout (the hanging one costs this long).
        .reward_timeout_s(5.0)
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
    // The two "slow" rewards still hold their grading threads (2 timeouts in a row are far
    // from the default limit of 16, so the step is not fatal).
    assert_eq!(m.values["reward_errors/hung_threads"], 2.0);
    // Failures score 0; "?" is correct: rewards [0,0,0,0,0,0,1,1].
    assert_eq!(m.reward_mean, 0.25);
    // A failed grade counts as 0 for every component seen in the batch.
    assert_eq!(m.correct, Some(0.25), "failed grades count as incorrect");
    assert_eq!(m.values["env/all/correct"], 0.25);
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
    assert_eq!(m.values["env/all/stop/max_tokens"], 0.5);
    assert!(!m.values.contains_key("env/all/stop/length"));
    // The truncated sample still counts in the mean: A = 1 − 0.5.
    let d = &backend.datums()[0][0];
    assert_eq!(d.advantages().unwrap(), &[0.0, 0.5, 0.5]);
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
    let adv = data[0].advantages().unwrap();
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
        // Samplers and sample calls in order: `None` = a new sampler, `Some(v)` = a sample
        // call by the sampler of policy version v.
        let timeline: Vec<(bool, u64)> = backend
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::NewSampler(v) => Some((true, v)),
                Event::Sample { version, .. } => Some((false, version)),
                _ => None,
            })
            .collect();
        (timeline, rows)
    };
    // On-policy: each batch is sampled after the previous step's new sampler, by it.
    let (timeline, rows) = run(0).await;
    assert_eq!(
        timeline,
        vec![
            (true, 0),
            (false, 0),
            (false, 0),
            (true, 1),
            (false, 1),
            (false, 1),
            (true, 2),
        ]
    );
    for m in &rows {
        assert!(
            m.values.keys().all(|k| !k.starts_with("async/")),
            "{:?}",
            m.values.keys().collect::<Vec<_>>()
        );
    }

    // One step off-policy: batch 1 is sampled by the version-0 sampler while step 0 trains,
    // before the version-1 sampler exists.
    let (timeline, rows) = run(1).await;
    assert_eq!(
        timeline,
        vec![
            (true, 0),
            (false, 0),
            (false, 0),
            (false, 0),
            (false, 0),
            (true, 1),
            (true, 2),
        ]
    );
    assert_eq!(rows[0].values["async/staleness_max"], 0.0);
    assert_eq!(rows[1].values["async/staleness_max"], 1.0);
    assert_eq!(rows[1].values["async/staleness_min"], 1.0);
    assert_eq!(rows[1].values["async/staleness_mean"], 1.0);
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
    assert!(
        summary
            .final_checkpoint
            .as_ref()
            .unwrap()
            .name
            .ends_with("-final")
    );

    let saved: TrainerConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    // The config as given, with the renderer's name filled in by the trainer.
    assert_eq!(&saved, trainer.config());
    assert_eq!(
        saved,
        TrainerConfig {
            renderer_name: Some("custom".into()),
            ..config
        }
    );
    assert!(!dir.path().join("config.resume-000003.json").exists());
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
    assert_eq!(samples[0]["policy_version"], 0);
    assert_eq!(samples[0]["staleness"], 0);
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
async fn samples_record_their_policy_version() {
    let dir = tempfile::tempdir().unwrap();
    let config = base_config()
        .max_steps(3)
        .max_steps_off_policy(1)
        .eval_every(0)
        .log_dir(dir.path())
        .build()
        .unwrap();
    GrpoTrainer::new(
        hand_case(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config,
    )
    .unwrap()
    .run()
    .await
    .unwrap();
    // Step 0 is sampled by policy 0; steps 1 and 2 are sampled one step ahead.
    for (step, version, staleness) in [(0, 0, 0), (1, 0, 1), (2, 1, 1)] {
        let rows = read_rows(&dir.path().join(format!("samples/{step:06}.jsonl")));
        assert_eq!(rows.len(), 4);
        for r in &rows {
            assert_eq!(r["policy_version"], version, "step {step}");
            assert_eq!(r["staleness"], staleness, "step {step}");
        }
        let html =
            std::fs::read_to_string(dir.path().join(format!("samples/{step:06}.html"))).unwrap();
        assert!(
            html.contains(&format!("policy <b>{version}</b>")),
            "step {step}"
        );
    }
}

/// `samples/` holds the step's first `log_sample_groups` groups (every completion of each);
/// `None` writes them all; 0 is refused.
#[tokio::test]
async fn samples_hold_the_first_groups_of_each_step() {
    for (limit, rows, groups) in [(Some(1), 2, vec![0]), (None, 4, vec![0, 1])] {
        let dir = tempfile::tempdir().unwrap();
        let config = base_config()
            .max_steps(1)
            .eval_every(0)
            .log_sample_groups(limit)
            .log_dir(dir.path())
            .build()
            .unwrap();
        GrpoTrainer::new(
            hand_case(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&[("a", "x"), ("b", "y")]),
            config,
        )
        .unwrap()
        .run()
        .await
        .unwrap();
        let got = read_rows(&dir.path().join("samples/000000.jsonl"));
        assert_eq!(got.len(), rows, "limit {limit:?}");
        let mut seen: Vec<u64> = got.iter().map(|r| r["group"].as_u64().unwrap()).collect();
        seen.dedup();
        assert_eq!(seen, groups, "limit {limit:?}");
    }
    let err = base_config()
        .log_sample_groups(Some(0))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("log_sample_groups"), "{err}");
}

/// The sampling params of every `sample` call, in order.
fn sample_params(backend: &ScriptedBackend) -> Vec<rlvr::types::SamplingParams> {
    backend
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Sample { params, .. } => Some(params),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn eval_sampling_settings_are_independent_of_training() {
    let run = |eval: rlvr::trainer::EvalConfig| async move {
        let backend = hand_case();
        let mut config = base_config()
            .temperature(0.7)
            .max_tokens(8)
            .eval_every(0)
            .build()
            .unwrap();
        config.eval = eval;
        let mut trainer = GrpoTrainer::new(
            backend.clone(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&[("a", "x"), ("b", "y")]),
            config,
        )
        .unwrap()
        .with_eval_dataset(problems(&[("a", "x"), ("b", "y")]));
        trainer.evaluate().await.unwrap();
        let eval_params = sample_params(&backend);
        trainer.step().await.unwrap();
        let train_params = sample_params(&backend)[eval_params.len()..].to_vec();
        (eval_params, train_params)
    };
    // Defaults: eval at temperature 1.0 and the training max_tokens.
    let (eval, train) = run(rlvr::trainer::EvalConfig::default()).await;
    assert_eq!(eval.len(), 2, "one call per eval problem");
    assert_eq!(train.len(), 2);
    for p in &eval {
        assert_eq!(p.temperature, 1.0);
        assert_eq!(p.max_tokens, Some(8));
        assert_eq!(p.stop, Some(rlvr::types::StopCondition::Tokens(vec![0])));
    }
    for p in &train {
        assert_eq!(p.temperature, 0.7);
        assert_eq!(p.max_tokens, Some(8));
    }
    // Greedy eval with its own token cap; training unchanged.
    let (eval, train) = run(rlvr::trainer::EvalConfig {
        temperature: 0.0,
        max_tokens: Some(3),
        ..Default::default()
    })
    .await;
    for p in &eval {
        assert_eq!(p.temperature, 0.0);
        assert_eq!(p.max_tokens, Some(3));
    }
    for p in &train {
        assert_eq!(p.temperature, 0.7);
        assert_eq!(p.max_tokens, Some(8));
    }
}

/// Problems "a"/"b" alternating; reading problem `fail_at` fails (a crash mid-run).
struct FailingAt {
    fail_at: usize,
}

impl Dataset for FailingAt {
    fn len(&self) -> usize {
        8
    }
    fn get(&self, index: usize) -> rlvr::Result<Problem> {
        if index == self.fail_at {
            return Err(rlvr::Error::Backend("disk gone".into()));
        }
        let (q, a) = if index.is_multiple_of(2) {
            ("a", "x")
        } else {
            ("b", "y")
        };
        Ok(Problem::new(format!("p{index}"), q, a))
    }
}

#[tokio::test]
async fn a_crashed_run_still_has_a_plot() {
    // batch_size 2, no shuffle: step 2 reads problem 4 and crashes. The plot was drawn after
    // step 0's evaluation (first case) or step 1's checkpoint (second case).
    for (eval_every, save_every) in [(2, 0), (0, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let config = base_config()
            .max_steps(4)
            .eval_every(eval_every)
            .save_every(save_every)
            .log_dir(dir.path())
            .build()
            .unwrap();
        let err = GrpoTrainer::new(
            hand_case(),
            Exact,
            Arc::new(ByteRenderer),
            Arc::new(FailingAt { fail_at: 4 }),
            config,
        )
        .unwrap()
        .with_eval_dataset(problems(&[("a", "x")]))
        .run()
        .await
        .unwrap_err();
        assert!(err.to_string().contains("disk gone"), "{err}");
        assert_eq!(read_rows(&dir.path().join("metrics.jsonl")).len(), 2);
        for f in ["reward.png", "reward.svg"] {
            assert!(
                dir.path().join(f).is_file(),
                "{f} with eval_every {eval_every}, save_every {save_every}"
            );
        }
    }
}

#[tokio::test]
async fn run_metadata_is_stored_in_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let config = base_config()
        .max_steps(1)
        .eval_every(0)
        .log_dir(dir.path())
        .build()
        .unwrap();
    GrpoTrainer::new(
        hand_case(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config.clone(),
    )
    .unwrap()
    .with_run_metadata(serde_json::json!({
        "model": "tiny", "backend": "scripted", "renderer": "bytes", "dataset": "hand",
        "api_key": "sk-secret",
    }))
    .run()
    .await
    .unwrap();
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["run"]["model"], "tiny");
    assert_eq!(doc["run"]["backend"], "scripted");
    assert_eq!(doc["run"]["renderer"], "bytes");
    assert_eq!(doc["run"]["dataset"], "hand");
    assert!(!text.contains("sk-secret"), "secrets are redacted: {text}");
    // The config itself still reads back, with the renderer's name filled in.
    assert_eq!(doc["renderer_name"], "custom");
    let saved: TrainerConfig = serde_json::from_str(&text).unwrap();
    assert_eq!(
        saved,
        TrainerConfig {
            renderer_name: Some("custom".into()),
            ..config
        }
    );
}

/// [`ByteRenderer`] under another name.
struct Named(&'static str);

impl rlvr::Renderer for Named {
    fn generation_prompt(
        &self,
        messages: &[rlvr::message::Message],
    ) -> rlvr::Result<rlvr::types::ModelInput> {
        ByteRenderer.generation_prompt(messages)
    }
    fn supervised_example(
        &self,
        messages: &[rlvr::message::Message],
        train_on: rlvr::renderer::TrainOnWhat,
    ) -> rlvr::Result<(rlvr::types::ModelInput, Vec<f32>)> {
        ByteRenderer.supervised_example(messages, train_on)
    }
    fn stop(&self) -> rlvr::types::StopCondition {
        ByteRenderer.stop()
    }
    fn parse_response(
        &self,
        tokens: &[rlvr::types::TokenId],
    ) -> (rlvr::message::Message, rlvr::renderer::ParseTermination) {
        ByteRenderer.parse_response(tokens)
    }
    fn name(&self) -> &str {
        self.0
    }
}

#[tokio::test]
async fn the_renderer_name_is_recorded_and_checked_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let ps = [("a", "x"), ("b", "y")];
    let config = |steps: u64| {
        base_config()
            .max_steps(steps)
            .eval_every(0)
            .log_dir(dir.path())
            .build()
            .unwrap()
    };
    let trainer = |name: &'static str, config: TrainerConfig| {
        GrpoTrainer::new(
            hand_case(),
            Exact,
            Arc::new(Named(name)),
            problems(&ps),
            config,
        )
    };
    let mut first = trainer("fmt_a", config(1)).unwrap();
    assert_eq!(first.config().renderer_name.as_deref(), Some("fmt_a"));
    first.run().await.unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(doc["renderer_name"], "fmt_a", "{doc}");

    // A config naming another renderer than the one given is refused at once.
    let mut named_b = config(2);
    named_b.renderer_name = Some("fmt_b".into());
    let err = trainer("fmt_a", named_b).unwrap_err();
    assert!(
        matches!(err, rlvr::Error::Config { field: ref f, .. } if f == "renderer_name"),
        "{err}"
    );
    // Resuming with another renderer is refused, like another seed or batch size.
    let err = trainer("fmt_b", config(2))
        .unwrap()
        .run()
        .await
        .unwrap_err();
    assert!(
        matches!(err, rlvr::Error::Config { field: ref f, .. } if f == "renderer_name"),
        "{err}"
    );
    assert!(err.to_string().contains("fmt_a"), "{err}");
    // With the same renderer it resumes.
    let summary = trainer("fmt_a", config(2)).unwrap().run().await.unwrap();
    assert_eq!((summary.start_step, summary.steps_run), (1, 1));
}

#[tokio::test]
async fn restarting_a_finished_run_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let config = base_config()
        .max_steps(2)
        .eval_every(1)
        .save_every(0)
        .log_dir(dir.path())
        .build()
        .unwrap();
    let make = |backend: ScriptedBackend| {
        GrpoTrainer::new(
            backend,
            Exact,
            Arc::new(ByteRenderer),
            problems(&[("a", "x"), ("b", "y")]),
            config.clone(),
        )
        .unwrap()
        .with_eval_dataset(problems(&[("a", "x")]))
    };
    let first = make(hand_case()).run().await.unwrap();
    assert_eq!(first.steps_run, 2);
    let metrics = std::fs::read(dir.path().join("metrics.jsonl")).unwrap();
    let config_json = std::fs::read(dir.path().join("config.json")).unwrap();
    assert_eq!(read_rows(&dir.path().join("metrics.jsonl")).len(), 3);

    // Restart on the finished directory: nothing trained, sampled or dropped.
    let again = hand_case();
    let summary = make(again.clone()).run().await.unwrap();
    assert_eq!(summary.steps_run, 0);
    assert_eq!(summary.start_step, 2);
    assert_eq!(summary.total_steps, 2);
    assert_eq!(
        std::fs::read(dir.path().join("metrics.jsonl")).unwrap(),
        metrics,
        "the final eval row is kept"
    );
    assert_eq!(
        std::fs::read(dir.path().join("config.json")).unwrap(),
        config_json
    );
    let leftovers: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("pre_resume") || n.contains("resume"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(again.events().iter().all(|e| matches!(e, Event::Load(_))));
    // The recorded summary comes back.
    assert_eq!(summary.final_checkpoint, first.final_checkpoint);
    let (a, b) = (summary.final_eval.unwrap(), first.final_eval.unwrap());
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    assert_eq!(a["test/env/all/correct"], 1.0);
    let last = summary.last_step.unwrap();
    assert_eq!(last.step, 1);
    assert_eq!(last.reward_mean, first.last_step.unwrap().reward_mean);
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
    let config_before = std::fs::read(dir.path().join("config.json")).unwrap();
    let short_config: TrainerConfig = serde_json::from_slice(&config_before).unwrap();
    assert_eq!(short_config.max_steps, Some(3));

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
    // config.json is the original run's; the resume wrote its own next to it.
    assert_eq!(
        std::fs::read(dir.path().join("config.json")).unwrap(),
        config_before
    );
    let resumed_config: TrainerConfig = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("config.resume-000002.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(resumed_config.max_steps, Some(4));
    // Resuming with another seed, batch size, shuffle or dataset would change the data
    // order: refused.
    let err = GrpoTrainer::new(
        hand_case(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&ps[..3]),
        base_config()
            .shuffle(true)
            .seed(3)
            .max_steps(5)
            .log_dir(dir.path())
            .build()
            .unwrap(),
    )
    .unwrap()
    .run()
    .await
    .unwrap_err();
    assert!(
        matches!(err, rlvr::Error::Config { field: ref f, .. } if f == "dataset"),
        "{err}"
    );
    for (field, bad) in [
        ("seed", base_config().seed(4)),
        ("batch_size", base_config().seed(3).batch_size(3)),
        ("shuffle", base_config().seed(3)),
    ] {
        let bad = bad.max_steps(5).log_dir(dir.path()).build().unwrap();
        let err = GrpoTrainer::new(
            hand_case(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&ps),
            bad,
        )
        .unwrap()
        .run()
        .await
        .unwrap_err();
        assert!(
            matches!(err, rlvr::Error::Config { field: ref f, .. } if f == field),
            "{err}"
        );
    }
    let Event::Load(name) = &resumed.events()[0] else {
        panic!("the resumed run starts by loading: {:?}", resumed.events());
    };
    assert!(name.ends_with("-000002"), "{name}");
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
    // Absurd sizes are refused up front, naming the field (no allocation overflow later).
    for (field, bad) in [
        ("batch_size", base_config().batch_size(usize::MAX).build()),
        ("group_size", base_config().group_size(usize::MAX).build()),
        (
            "group_size",
            base_config()
                .group_size(rlvr::trainer::MAX_GROUP_SIZE + 1)
                .build(),
        ),
        (
            "eval.group_size",
            base_config()
                .eval(rlvr::trainer::EvalConfig {
                    group_size: usize::MAX,
                    ..Default::default()
                })
                .build(),
        ),
    ] {
        let err = bad.unwrap_err();
        assert!(
            matches!(err, rlvr::Error::Config { field: ref f, .. } if f == field),
            "{err}"
        );
    }
    assert!(
        base_config()
            .batch_size(rlvr::trainer::MAX_BATCH_SIZE)
            .group_size(rlvr::trainer::MAX_GROUP_SIZE)
            .build()
            .is_ok()
    );
}

#[tokio::test]
async fn huge_max_steps_off_policy_samples_only_the_steps_left() {
    let backend = hand_case();
    let config = base_config()
        .max_steps(2)
        .max_steps_off_policy(u64::MAX)
        .eval_every(0)
        .build()
        .unwrap();
    let mut trainer = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config,
    )
    .unwrap();
    let summary = trainer.run().await.unwrap();
    assert_eq!(summary.steps_run, 2);
    // Two batches of two prompts, each sampled once: nothing past the last step.
    let samples = backend
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Sample { .. }))
        .count();
    assert_eq!(samples, 4);
    assert_eq!(
        summary.last_step.unwrap().values["async/staleness_max"],
        1.0
    );
}

/// A single-turn problem is a `ProblemEnv`: the trainer's default rollout is the
/// `ProblemEnvBuilder` over its renderer and reward, so naming that builder explicitly gives
/// the same calls (prompts, seeds, order) and the hand-computed datums of
/// `hand_computed_datums_and_advantages`.
#[tokio::test]
async fn a_single_turn_problem_is_a_problem_env() {
    use rlvr::trainer::ProblemEnvBuilder;
    let ps = [("a", "x"), ("b", "y")];
    let default = hand_case();
    let mut t = GrpoTrainer::new(
        default.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&ps),
        base_config().build().unwrap(),
    )
    .unwrap();
    let m1 = t.step().await.unwrap();

    let explicit = hand_case();
    let renderer: Arc<dyn rlvr::Renderer> = Arc::new(ByteRenderer);
    let builder = ProblemEnvBuilder::new(
        Arc::clone(&renderer),
        Arc::new(Exact),
        Duration::from_secs(5),
    );
    let mut t = GrpoTrainer::new(
        explicit.clone(),
        Exact,
        renderer,
        problems(&ps),
        base_config().build().unwrap(),
    )
    .unwrap()
    .with_env_builder(Arc::new(builder));
    let m2 = t.step().await.unwrap();

    // The hand-computed datums: "a>" + "x"/"z" + stop, A = ±0.5; "b" is degenerate.
    let calls = explicit.datums();
    assert_eq!(calls.len(), 1, "one forward_backward call");
    let data = &calls[0];
    assert_eq!(data.len(), 2, "the degenerate group is skipped");
    let d = &data[0];
    assert_eq!(d.model_input.to_tokens(), vec![97, 62, 120]);
    assert_eq!(d.target_tokens().unwrap(), &[62, 120, 0]);
    assert_eq!(d.logprobs().unwrap(), &[0.0, -0.5, -0.25]);
    assert_eq!(d.advantages().unwrap(), &[0.0, 0.5, 0.5]);
    let d = &data[1];
    assert_eq!(d.model_input.to_tokens(), vec![97, 62, 122]);
    assert_eq!(d.target_tokens().unwrap(), &[62, 122, 0]);
    assert_eq!(d.logprobs().unwrap(), &[0.0, -1.0, -0.125]);
    assert_eq!(d.advantages().unwrap(), &[0.0, -0.5, -0.5]);

    assert_eq!(default.datums(), explicit.datums());
    assert_eq!(
        default.events(),
        explicit.events(),
        "same calls, seeds and order"
    );
    for key in [
        "env/all/reward/total",
        "env/all/correct",
        "env/all/format",
        "env/all/by_group/frac_mixed",
        "env/all/ac_tokens_per_turn",
        "env/all/ob_tokens_per_turn",
        "env/all/total_turns",
        "env/all/stop/max_tokens",
        "env/all/parse_clean",
        "reward_errors/total",
        "train/datums",
        "tokens/trained",
    ] {
        assert_eq!(m1.values[key], m2.values[key], "{key}");
    }
    // Both runs go through the sample and grade phases.
    for m in [&m1, &m2] {
        assert!(m.values.contains_key("time/sampling"));
        assert!(m.values.contains_key("time/grading"));
    }
}

/// `ProblemEnv` on its own: the rendered prompt as the observation with the renderer's stop
/// condition, one graded step that ends the episode, the reward's components as metrics, and
/// a failing reward scored 0 with its error.
#[tokio::test]
async fn problem_env_renders_grades_and_ends() {
    use rlvr::trainer::{Env, ProblemEnv};
    let renderer: Arc<dyn rlvr::Renderer> = Arc::new(ByteRenderer);
    let problem = Arc::new(problems(&[("a", "x")]).get(0).unwrap());
    let mut env = ProblemEnv::new(
        Arc::clone(&renderer),
        Arc::new(Exact),
        Arc::clone(&problem),
        Duration::from_secs(5),
    );
    let ob = env.initial_observation().await.unwrap();
    assert_eq!(ob.input.to_tokens(), vec![97, 62], "\"a>\"");
    assert_eq!(ob.stop, renderer.stop());
    let seq = |text: &str| rlvr::types::SampledSequence {
        tokens: text.bytes().map(u32::from).chain([0]).collect(),
        logprobs: vec![-0.5; text.len() + 1],
        stop_reason: rlvr::types::StopReason::Stop,
        sequence_id: None,
    };
    let hit = env.step(&seq("x")).await.unwrap();
    assert!(hit.done && hit.next.is_none());
    assert_eq!(hit.reward, 1.0);
    assert_eq!(hit.metrics["correct"], 1.0, "the reward's components");
    assert!(hit.reward_error.is_none());
    let miss = ProblemEnv::new(
        Arc::clone(&renderer),
        Arc::new(Exact),
        Arc::clone(&problem),
        Duration::from_secs(5),
    )
    .step(&seq("z"))
    .await
    .unwrap();
    assert!(miss.done);
    assert_eq!(miss.reward, 0.0);

    let failing = Arc::new(problems(&[("a", "err")]).get(0).unwrap());
    let failed = ProblemEnv::new(renderer, Arc::new(Exact), failing, Duration::from_secs(5))
        .step(&seq("x"))
        .await
        .unwrap();
    assert!(failed.done);
    assert_eq!(failed.reward, 0.0);
    assert!(failed.reward_error.is_some());
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
            input: rlvr::types::ModelInput::from_tokens(self.context.clone()),
            stop: rlvr::types::StopCondition::Tokens(vec![0]),
        })
    }
    async fn step(
        &mut self,
        action: &rlvr::types::SampledSequence,
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
                input: rlvr::types::ModelInput::from_tokens(self.context.clone()),
                stop: rlvr::types::StopCondition::Tokens(vec![0]),
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
    // Three turns over two episodes: actions "3\0", "5\0" (episode 1) and "5\0"; the
    // observations "g>", "g>3\0no>" and "g>" (each turn's whole context, as the cookbook).
    assert_eq!(m.values["env/all/total_episodes"], 2.0);
    assert_eq!(m.values["env/all/total_turns"], 3.0);
    assert_eq!(m.values["env/all/turns_per_episode"], 1.5);
    assert_eq!(m.values["env/all/total_ac_tokens"], 6.0);
    assert_eq!(m.values["env/all/ac_tokens_per_turn"], 2.0);
    assert_eq!(m.values["env/all/total_ob_tokens"], 11.0);
    assert_eq!(m.values["env/all/ob_tokens_per_turn"], 11.0 / 3.0);
    let data = &backend.datums()[0];
    assert_eq!(data.len(), 2);
    // Episode 1: "g>" + "3\0" + "no>" + "5\0" in one datum; "no>" is masked (advantage 0).
    let d = &data[0];
    let full: Vec<u32> = "g>3\0no>5\0".bytes().map(u32::from).collect();
    assert_eq!(d.model_input.to_tokens(), full[..full.len() - 1].to_vec());
    let targets: Vec<i64> = full[1..].iter().map(|&t| i64::from(t)).collect();
    assert_eq!(d.target_tokens().unwrap(), &targets[..]);
    assert_eq!(
        d.logprobs().unwrap(),
        &[0.0, -1.0, -0.5, 0.0, 0.0, 0.0, -2.0, -0.75]
    );
    let a = -0.25f32;
    assert_eq!(d.advantages().unwrap(), &[0.0, a, a, 0.0, 0.0, 0.0, a, a]);
    // Episode 2: a single turn.
    let d = &data[1];
    assert_eq!(d.model_input.to_tokens(), vec![103, 62, 53]);
    assert_eq!(d.advantages().unwrap(), &[0.0, 0.25, 0.25]);
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
                &rlvr::types::ModelInput::from_tokens(vec![97, 62]),
                2,
                &rlvr::types::SamplingParams::default(),
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
        .loss(rlvr::types::LossFn::Cispo {
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
        == rlvr::types::LossFn::Cispo {
            clip_low_threshold: 0.5,
            clip_high_threshold: 2.0
        }));
}

/// Interrupted-and-resumed training on the local backend ends bit-identical to an
/// uninterrupted run: same weights and optimizer state, same metrics rows.
#[cfg(feature = "local")]
mod local {
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_trait::async_trait;
    use rlvr::backend::local::{LocalBackend, LocalOptions, Qwen3Config, char_tokenizer};
    use rlvr::{GrpoTrainer, TrainerConfig, trainer::Evaluator};
    use rlvr::{RoleColon, Sampler, dataset::Problem};

    fn backend(checkpoints: &Path) -> LocalBackend {
        crate::common::tiny_lora_backend(|o| o.checkpoint_dir(checkpoints))
    }

    /// A backend created without a checkpoint directory, driven by a trainer with a run
    /// directory, keeps its checkpoints in `<log_dir>/checkpoints` (where `export` and resume
    /// look), not in the user cache; the checkpoint merges into a model directory from there.
    #[tokio::test]
    async fn local_checkpoints_default_to_the_run_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut vocab: Vec<String> = vec!["<eos>".into()];
        vocab.extend("0123456789 :+=?\nUA".chars().map(|c| c.to_string()));
        let tok = char_tokenizer(&vocab, Some(0)).unwrap();
        let cfg = Qwen3Config::new(vocab.len(), 16, 24, 1, 2, 1, 8, 128);
        let b = LocalBackend::random(cfg, tok, LocalOptions::default().seed(1)).unwrap();
        let model = dir.path().join("model");
        b.export_hf(&model).await.unwrap();
        let renderer = Arc::new(RoleColon::new(rlvr::PolicyBackend::tokenizer(&b).clone()));
        let reward = |_: &Problem, text: &str| text.chars().count() as f64 / 8.0;
        let run = dir.path().join("run");
        let config = TrainerConfig::builder()
            .batch_size(2)
            .group_size(2)
            .max_tokens(4)
            .max_steps(1)
            .save_every(1)
            .eval_every(0)
            .progress(false)
            .log_dir(&run)
            .build()
            .unwrap();
        GrpoTrainer::new(b, reward, renderer, problems(), config)
            .unwrap()
            .run()
            .await
            .unwrap();
        let records = rlvr::report::RunDir::create(&run)
            .unwrap()
            .read_checkpoints()
            .unwrap();
        assert!(!records.is_empty());
        for r in &records {
            assert!(
                Path::new(&r.backend.path).starts_with(run.join("checkpoints")),
                "{} is not in the run directory",
                r.backend.path
            );
        }
        let merged = dir.path().join("merged");
        rlvr::weights::build_hf_model(&model, &records[0].backend.path, &merged).unwrap();
        assert!(merged.join("model.safetensors").is_file());
    }

    /// Logs the step; fails once at `fail_at` while armed (a simulated crash).
    struct CrashOnce {
        fail_at: u64,
        armed: Arc<AtomicBool>,
    }

    #[async_trait]
    impl<S: Sampler> Evaluator<S> for CrashOnce {
        fn name(&self) -> &str {
            "probe"
        }
        async fn evaluate(
            &self,
            _sampler: &S,
            step: u64,
        ) -> rlvr::Result<std::collections::BTreeMap<String, f64>> {
            if step == self.fail_at && self.armed.swap(false, Ordering::SeqCst) {
                return Err(rlvr::Error::Cancelled("simulated crash".into()));
            }
            Ok([("step".to_string(), step as f64)].into_iter().collect())
        }
    }

    fn problems() -> Arc<dyn rlvr::Dataset> {
        Arc::new(
            (0..6)
                .map(|i| Problem::new(format!("p{i}"), format!("{i}+{i}=?"), format!("{}", 2 * i)))
                .collect::<Vec<_>>(),
        )
    }

    async fn run(dir: &Path, crash: bool) -> rlvr::Result<rlvr::trainer::RunSummary> {
        let b = backend(&dir.join("backend"));
        let renderer = Arc::new(RoleColon::new(rlvr::PolicyBackend::tokenizer(&b).clone()));
        // A graded reward (longer answers score higher) so that groups are rarely constant.
        let reward = |_: &Problem, text: &str| text.chars().count() as f64 / 8.0;
        let config = TrainerConfig::builder()
            .batch_size(2)
            .group_size(4)
            .max_tokens(8)
            .learning_rate(1e-2)
            .seed(5)
            .max_steps(4)
            .save_every(2)
            .eval_every(3)
            .progress(false)
            .log_dir(dir.join("run"))
            .build()?;
        GrpoTrainer::new(b, reward, renderer, problems(), config)?
            .with_evaluator(CrashOnce {
                fail_at: 3,
                armed: Arc::new(AtomicBool::new(crash)),
            })
            .run()
            .await
    }

    fn rows(dir: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
        std::fs::read_to_string(dir.join("run/metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let mut row: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(l).unwrap();
                row.retain(|k, _| !k.starts_with("time/"));
                row
            })
            .collect()
    }

    /// Gradients accumulate over `forward_backward` calls: two minibatches per optimizer
    /// step train the same policy as one call (up to float summation order).
    #[tokio::test]
    async fn minibatches_accumulate_like_one_call() {
        let probe = rlvr::types::ModelInput::from_tokens(vec![3, 5, 7, 9, 11, 13]);
        let mut logprobs = Vec::new();
        for minibatches in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            let b = backend(&dir.path().join("backend"));
            let renderer = Arc::new(RoleColon::new(rlvr::PolicyBackend::tokenizer(&b).clone()));
            let reward =
                |_: &Problem, text: &str| text.chars().filter(|c| *c == 'a').count() as f64;
            let config = TrainerConfig::builder()
                .batch_size(2)
                .group_size(4)
                .max_tokens(8)
                .learning_rate(1e-2)
                .keep_degenerate_groups(true)
                .num_minibatches(minibatches)
                .progress(false)
                .build()
                .unwrap();
            let mut t = GrpoTrainer::new(b, reward, renderer, problems(), config).unwrap();
            for _ in 0..2 {
                t.step().await.unwrap();
            }
            let b = t.into_backend();
            let lp = rlvr::PolicyBackend::sampler(&b)
                .await
                .unwrap()
                .compute_logprobs(&probe)
                .await
                .unwrap();
            logprobs.push(lp);
        }
        for (a, b) in logprobs[0].iter().zip(&logprobs[1]).skip(1) {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!(
                (a - b).abs() < 1e-4,
                "{:?} vs {:?}",
                logprobs[0],
                logprobs[1]
            );
        }
        // …and it did train: the policy moved away from its initialisation.
        let dir = tempfile::tempdir().unwrap();
        let untrained = rlvr::PolicyBackend::sampler(&backend(dir.path()))
            .await
            .unwrap()
            .compute_logprobs(&probe)
            .await
            .unwrap();
        let moved = untrained
            .iter()
            .zip(&logprobs[0])
            .skip(1)
            .map(|(a, b)| (a.unwrap() - b.unwrap()).abs())
            .fold(0.0f32, f32::max);
        assert!(moved > 1e-3, "no training happened ({moved})");
    }

    #[tokio::test]
    async fn interrupted_and_resumed_run_is_bit_identical() {
        let straight = tempfile::tempdir().unwrap();
        let summary = run(straight.path(), false).await.unwrap();
        assert_eq!(summary.steps_run, 4);

        let resumed = tempfile::tempdir().unwrap();
        // Crashes at step 3's evaluation, after checkpoint 000002 and the rows of steps 0–2.
        let err = run(resumed.path(), true).await.unwrap_err();
        assert!(matches!(err, rlvr::Error::Cancelled(_)), "{err}");
        assert_eq!(rows(resumed.path()).len(), 3);
        let summary = run(resumed.path(), false).await.unwrap();
        assert_eq!((summary.start_step, summary.steps_run), (2, 2));

        let a = rows(straight.path());
        let b = rows(resumed.path());
        assert_eq!(a.len(), 5, "4 steps + the final eval row");
        assert_eq!(a, b);
        assert!(
            a.iter()
                .any(|r| r.get("optim/updates").and_then(|v| v.as_f64()) == Some(1.0)),
            "the run must actually train"
        );
        let final_dir = |dir: &Path| {
            let text = std::fs::read_to_string(dir.join("run/checkpoints.jsonl")).unwrap();
            let last: serde_json::Value =
                serde_json::from_str(text.lines().last().unwrap()).unwrap();
            assert_eq!(last["name"], "final");
            std::path::PathBuf::from(last["backend"]["path"].as_str().unwrap())
        };
        let (fa, fb) = (final_dir(straight.path()), final_dir(resumed.path()));
        assert!(fa.starts_with(straight.path()) && fb.starts_with(resumed.path()));
        for file in ["params.safetensors", "optimizer.safetensors"] {
            let x = std::fs::read(fa.join(file)).unwrap();
            let y = std::fs::read(fb.join(file)).unwrap();
            assert!(x == y, "{file} differs");
        }
    }
}

#[tokio::test]
async fn streamed_minibatches_send_the_same_datums() {
    let mixed = || {
        ScriptedBackend::new(script(&[
            (
                "a>",
                vec![
                    Scripted::new("x", &[-1.0, -0.5]),
                    Scripted::new("z", &[-1.0, -0.5]),
                ],
            ),
            (
                "b>",
                vec![
                    Scripted::new("z", &[-0.25, -0.5]),
                    Scripted::new("x", &[-1.0, -0.5]),
                ],
            ),
            (
                "c>",
                vec![
                    Scripted::new("x", &[-2.0, -0.5]),
                    Scripted::new("z", &[-1.0, -0.5]),
                ],
            ),
            (
                "slow>",
                vec![
                    Scripted::new("z", &[-3.0, -0.5]),
                    Scripted::new("x", &[-1.0, -0.5]),
                ],
            ),
        ]))
    };
    let ps = [("a", "x"), ("b", "x"), ("c", "x"), ("slow", "x")];
    let mut done_at_fb = Vec::new();
    let mut rows = Vec::new();
    let mut sent = Vec::new();
    for stream in [false, true] {
        let backend = mixed();
        let config = base_config()
            .batch_size(4)
            .num_minibatches(2)
            .stream_minibatches(stream)
            .kl_penalty_coef(0.1)
            .build()
            .unwrap();
        let mut t = GrpoTrainer::new(
            backend.clone(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&ps),
            config,
        )
        .unwrap();
        rows.push(t.step().await.unwrap());
        let events: Vec<Event> = backend
            .events()
            .into_iter()
            .filter(|e| !matches!(e, Event::Sample { .. } | Event::NewSampler(_)))
            .collect();
        use Event::*;
        assert_eq!(
            events,
            vec![
                SubmitForwardBackward(4),
                SubmitForwardBackward(4),
                SubmitOptim,
                AwaitForwardBackward,
                AwaitForwardBackward,
                AwaitOptim
            ],
            "stream = {stream}"
        );
        let mut datums: Vec<String> = backend
            .datums()
            .into_iter()
            .flatten()
            .map(|d| {
                format!(
                    "{:?}",
                    (
                        d.model_input.to_tokens(),
                        d.input("target_tokens"),
                        d.input("logprobs")
                    )
                )
            })
            .collect();
        datums.sort();
        sent.push(datums);
        done_at_fb.push(backend.shared.lock().unwrap().samples_done_at_fb.clone());
    }
    // Without streaming, training starts after all 4 prompts are sampled; with it, the first
    // minibatch is submitted while the slow prompt is still sampling.
    assert_eq!(done_at_fb[0], vec![4, 4]);
    assert_eq!(done_at_fb[1], vec![3, 4]);
    // The same datums (in completion order when streaming) and the same row.
    assert_eq!(sent[0], sent[1]);
    for key in [
        "env/all/reward/total",
        "train/datums",
        "tokens/trained",
        "optim/updates",
    ] {
        assert_eq!(rows[0].values[key], rows[1].values[key], "{key}");
    }
    // The KL average is taken per minibatch when streaming, over the batch otherwise.
    assert!(rows[1].values.contains_key("kl_policy_base"));

    let err = base_config()
        .stream_minibatches(true)
        .num_substeps(2)
        .build()
        .unwrap_err();
    assert!(matches!(err, rlvr::Error::Config { ref field, .. } if field == "stream_minibatches"));
}

/// Dynamic sampling: prompts "a>", "m>" and "slow>" (answer "x") get rewards [1, 0] or
/// [0, 1]; every other prompt gets "?" twice, a degenerate group.
fn ds_backend() -> ScriptedBackend {
    ScriptedBackend::new(script(&[
        (
            "a>",
            vec![
                Scripted::new("x", &[-0.5, -0.25]),
                Scripted::new("z", &[-1.0, -0.125]),
            ],
        ),
        (
            "m>",
            vec![
                Scripted::new("z", &[-0.75, -0.5]),
                Scripted::new("x", &[-0.25, -0.5]),
            ],
        ),
        (
            "slow>",
            vec![
                Scripted::new("x", &[-0.5, -0.5]),
                Scripted::new("z", &[-1.0, -0.5]),
            ],
        ),
    ]))
}

/// `dynamic_sampling/{rounds, groups_sampled, groups_kept, groups_missing}`.
fn ds_values(m: &rlvr::trainer::StepMetrics) -> [f64; 4] {
    ["rounds", "groups_sampled", "groups_kept", "groups_missing"]
        .map(|k| m.values[&format!("dynamic_sampling/{k}")])
}

/// The seed of every `sample` call, in order.
fn sample_seeds(b: &ScriptedBackend) -> Vec<Option<u64>> {
    b.events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Sample { seed, .. } => Some(seed),
            _ => None,
        })
        .collect()
}

/// The prompt (up to its `>`) of every datum sent, in order.
fn trained_prompts(b: &ScriptedBackend) -> Vec<String> {
    b.datums()
        .into_iter()
        .flatten()
        .map(|d| {
            let tokens = d.model_input.to_tokens();
            let end = tokens.iter().position(|&t| t == 62).unwrap();
            tokens[..=end].iter().map(|&t| t as u8 as char).collect()
        })
        .collect()
}

/// A metrics row without its timings.
fn untimed(m: &rlvr::trainer::StepMetrics) -> std::collections::BTreeMap<String, f64> {
    let mut v = m.values.clone();
    v.retain(|k, _| !k.starts_with("time/"));
    v
}

#[tokio::test]
async fn dynamic_sampling_replaces_degenerate_groups() {
    // Round 0 is the main batch [a, b]: one group with differing rewards. Round 1 draws the
    // whole second pass's first epoch (2 problems of 2): one more "a", and the batch is full.
    let backend = ds_backend();
    let config = base_config().dynamic_sampling_rounds(3).build().unwrap();
    let mut t = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        config,
    )
    .unwrap();
    let m = t.step().await.unwrap();
    assert_eq!(ds_values(&m), [1.0, 4.0, 2.0, 0.0]);
    // Rounds run only while needed: 2 rounds of 2 groups, not 4 rounds.
    let seeds = sample_seeds(&backend);
    assert_eq!(seeds.len(), 4);
    let mut distinct = seeds.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "every round samples with its own seeds");
    // The trained batch: batch_size groups, all with differing rewards, 2 completions each.
    assert_eq!(trained_prompts(&backend), ["a>"; 4]);
    assert_eq!(m.datums, 4);
    assert_eq!(m.values["train/groups_skipped"], 2.0);
    // The env/all metrics and the sampled tokens cover every group sampled, both rounds.
    assert_eq!(m.frac_degenerate, 0.5);
    assert_eq!(m.values["env/all/total_episodes"], 8.0);
    assert_eq!(m.values["env/all/by_group/frac_mixed"], 0.5);
    assert_eq!(m.values["env/all/reward/total"], 0.25);
    assert_eq!(m.sampled_tokens, 16);
    assert_eq!(m.values["tokens/trained"], 12.0);
    assert_eq!(m.values["optim/updates"], 1.0);

    // Without dynamic sampling: one round, no dynamic_sampling keys.
    let backend = ds_backend();
    let mut t = GrpoTrainer::new(
        backend.clone(),
        Exact,
        Arc::new(ByteRenderer),
        problems(&[("a", "x"), ("b", "y")]),
        base_config().build().unwrap(),
    )
    .unwrap();
    let m = t.step().await.unwrap();
    assert!(!m.values.keys().any(|k| k.starts_with("dynamic_sampling/")));
    assert_eq!(sample_seeds(&backend).len(), 2);
    // Round 0's seeds are the ones of a run without dynamic sampling.
    assert_eq!(sample_seeds(&backend)[..], seeds[..2]);
    assert_eq!(m.datums, 2);
}

#[tokio::test]
async fn dynamic_sampling_short_batch_trains_on_what_is_in() {
    let run = |ps: Vec<(&'static str, &'static str)>, b: usize, rounds: usize| async move {
        let backend = ds_backend();
        let config = base_config()
            .batch_size(b)
            .dynamic_sampling_rounds(rounds)
            .build()
            .unwrap();
        let mut t = GrpoTrainer::new(
            backend.clone(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&ps),
            config,
        )
        .unwrap();
        let m = t.step().await.unwrap();
        (m, backend)
    };
    // batch_size = the dataset's length: every round draws exactly one "a". Three rounds
    // (main + 2 extra) give 3 of the 4 groups wanted.
    let ps = vec![("a", "x"), ("c", "y"), ("d", "y"), ("e", "y")];
    let (m, backend) = run(ps, 4, 2).await;
    assert_eq!(ds_values(&m), [2.0, 12.0, 3.0, 1.0]);
    assert_eq!(trained_prompts(&backend), ["a>"; 6]);
    assert_eq!(m.values["train/groups_skipped"], 9.0);
    assert_eq!(m.values["optim/updates"], 1.0);
    // Nothing to train on after every round: no update, the row still logged.
    let (m, backend) = run(vec![("c", "y"), ("d", "y")], 2, 3).await;
    assert_eq!(ds_values(&m), [3.0, 8.0, 0.0, 2.0]);
    assert_eq!(m.values["optim/updates"], 0.0);
    assert!(backend.datums().is_empty());
    assert_eq!(m.frac_degenerate, 1.0);
    // A full batch in round 0: no extra round.
    let (m, backend) = run(vec![("a", "x"), ("m", "x")], 2, 3).await;
    assert_eq!(ds_values(&m), [0.0, 2.0, 2.0, 0.0]);
    assert_eq!(sample_seeds(&backend).len(), 2);
}

#[tokio::test]
async fn dynamic_sampling_streams_the_same_kept_groups() {
    // Round 0 (the whole dataset, in order) has 3 groups with differing rewards; round 1
    // needs one more. With seed 7 its draw has "slow" before "a" and "m": the group kept is
    // "slow"'s, which arrives after theirs — streaming must wait for it.
    let ps = [("slow", "x"), ("a", "x"), ("m", "x"), ("c", "y")];
    let mut rows = Vec::new();
    let mut sent = Vec::new();
    let mut prompts = Vec::new();
    for stream in [false, true] {
        let backend = ds_backend();
        let config = base_config()
            .batch_size(4)
            .seed(7)
            .max_steps(1)
            .num_minibatches(2)
            .stream_minibatches(stream)
            .dynamic_sampling_rounds(2)
            .build()
            .unwrap();
        let mut t = GrpoTrainer::new(
            backend.clone(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&ps),
            config,
        )
        .unwrap();
        let m = t.step().await.unwrap();
        assert_eq!(ds_values(&m), [1.0, 8.0, 4.0, 0.0]);
        let mut v = untimed(&m);
        // The backend's loss metric is summed over `forward_backward` calls.
        v.remove("optim/loss:sum");
        rows.push(v);
        let mut datums: Vec<String> = backend
            .datums()
            .into_iter()
            .flatten()
            .map(|d| format!("{:?}", (d.model_input.to_tokens(), d.input("advantages"))))
            .collect();
        datums.sort();
        sent.push(datums);
        prompts.push(trained_prompts(&backend));
        if stream {
            // Each minibatch is half the kept groups: 2 groups × 2 completions.
            let calls: Vec<Event> = backend
                .events()
                .into_iter()
                .filter(|e| matches!(e, Event::SubmitForwardBackward(_)))
                .collect();
            assert_eq!(calls, vec![Event::SubmitForwardBackward(4); 2]);
        }
    }
    assert_eq!(rows[0], rows[1]);
    assert_eq!(sent[0], sent[1]);
    // Step 0 trained "slow" twice, round 0's group and round 1's; so did the streamed run.
    for p in &prompts {
        assert_eq!(p.iter().filter(|p| *p == "slow>").count(), 4, "{p:?}");
    }
}

#[tokio::test]
async fn dynamic_sampling_off_policy_and_twice_the_same() {
    let ps = [
        ("a", "x"),
        ("c", "y"),
        ("m", "x"),
        ("d", "y"),
        ("e", "y"),
        ("f", "y"),
    ];
    let run = |off_policy: u64| async move {
        let dir = tempfile::tempdir().unwrap();
        let config = base_config()
            .batch_size(3)
            .shuffle(true)
            .seed(11)
            .max_steps(4)
            .eval_every(0)
            .save_every(2)
            .max_steps_off_policy(off_policy)
            .dynamic_sampling_rounds(3)
            .log_dir(dir.path())
            .build()
            .unwrap();
        let backend = ds_backend();
        GrpoTrainer::new(
            backend.clone(),
            Exact,
            Arc::new(ByteRenderer),
            problems(&ps),
            config,
        )
        .unwrap()
        .run()
        .await
        .unwrap();
        let mut rows = read_rows(&dir.path().join("metrics.jsonl"));
        for r in &mut rows {
            r.as_object_mut()
                .unwrap()
                .retain(|k, _| !k.starts_with("time/") && !k.starts_with("async/"));
        }
        (rows, sample_seeds(&backend), trained_prompts(&backend), dir)
    };
    let (on, on_seeds, on_prompts, _d0) = run(0).await;
    // Deterministic: the same run twice gives the same rows.
    let (again, again_seeds, _, _d1) = run(0).await;
    assert_eq!(on, again);
    assert_eq!(on_seeds, again_seeds);
    assert!(
        on.iter()
            .any(|r| r["dynamic_sampling/rounds"].as_f64() > Some(0.0))
    );
    // Sampled ahead, a step's rollout is every round of it: the same groups (the scripted
    // sampler ignores the policy), seeds and rows.
    let (off, off_seeds, off_prompts, dir) = run(1).await;
    assert_eq!(on, off);
    let (mut a, mut b) = (on_seeds.clone(), off_seeds);
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    assert_eq!(on_prompts, off_prompts);
    // The checkpoint at step 2 saved step 2's rollout with its kept groups.
    let saved: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("prefetched").join("000002.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(saved["format"], "rlvr-prefetched/2");
    let rollout = &saved["rollouts"][0];
    assert_eq!(rollout["step"], 2);
    let groups = rollout["groups"].as_array().unwrap().len();
    assert_eq!(groups as f64, on[2]["dynamic_sampling/groups_sampled"]);
    assert_eq!(
        rollout["kept"].as_array().unwrap().len() as f64,
        on[2]["dynamic_sampling/groups_kept"]
    );
}

#[tokio::test]
async fn dynamic_sampling_resumes_with_the_same_groups() {
    // Off-policy, so the checkpoint at step 2 carries step 2's rollout (every round).
    let ps = [("a", "x"), ("c", "y"), ("m", "x"), ("d", "y"), ("e", "y")];
    let config = |dir: &std::path::Path, steps: u64| {
        base_config()
            .batch_size(3)
            .shuffle(true)
            .seed(4)
            .max_steps(steps)
            .save_every(2)
            .eval_every(0)
            .max_steps_off_policy(1)
            .dynamic_sampling_rounds(2)
            .log_dir(dir)
            .build()
            .unwrap()
    };
    let train = |backend: ScriptedBackend, config: TrainerConfig| async move {
        GrpoTrainer::new(
            backend,
            Exact,
            Arc::new(ByteRenderer),
            problems(&ps),
            config,
        )
        .unwrap()
        .run()
        .await
        .unwrap()
    };
    let reference = ds_backend();
    let ref_dir = tempfile::tempdir().unwrap();
    train(reference.clone(), config(ref_dir.path(), 4)).await;
    // A run that saved `000002`, logged step 2 and crashed (its `final` record dropped).
    let dir = tempfile::tempdir().unwrap();
    train(ds_backend(), config(dir.path(), 3)).await;
    let ck = dir.path().join("checkpoints.jsonl");
    let first = std::fs::read_to_string(&ck)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    std::fs::write(&ck, first + "\n").unwrap();
    let resumed = ds_backend();
    let summary = train(resumed.clone(), config(dir.path(), 4)).await;
    assert_eq!(summary.start_step, 2);
    // The resumed run trains on the saved step 2 and samples only step 3, with the seeds
    // and problems of the uninterrupted run.
    let (ref_seeds, resumed_seeds) = (sample_seeds(&reference), sample_seeds(&resumed));
    assert!(!resumed_seeds.is_empty());
    assert!(ref_seeds.ends_with(&resumed_seeds));
    assert!(reference.datums().ends_with(&resumed.datums()));
    let strip = |path: &std::path::Path| {
        let mut rows = read_rows(path);
        for r in &mut rows {
            // (`progress/done_frac` of the first life's rows is over its 3 steps.)
            r.as_object_mut()
                .unwrap()
                .retain(|k, _| !k.starts_with("time/") && k != "progress/done_frac");
        }
        rows
    };
    let rows = strip(&dir.path().join("metrics.jsonl"));
    assert_eq!(rows, strip(&ref_dir.path().join("metrics.jsonl")));
    assert_eq!(rows.len(), 4);
    assert!(
        rows.iter()
            .all(|r| r.get("dynamic_sampling/groups_kept").is_some())
    );
}

#[tokio::test]
async fn dynamic_sampling_with_a_custom_env_builder() {
    // "g" gives returns [0.5, 1.0]; "h" (unscripted: "?" on both turns) [0, 0], degenerate.
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
        problems(&[("g", "unused"), ("h", "unused")]),
        base_config().dynamic_sampling_rounds(1).build().unwrap(),
    )
    .unwrap()
    .with_env_builder(Arc::new(GuessBuilder));
    let m = t.step().await.unwrap();
    // Round 1 draws both problems again: one more "g" fills the batch.
    assert_eq!(ds_values(&m), [1.0, 4.0, 2.0, 0.0]);
    assert_eq!(trained_prompts(&backend), ["g>"; 4]);
    assert_eq!(m.values["train/groups_skipped"], 2.0);
}
