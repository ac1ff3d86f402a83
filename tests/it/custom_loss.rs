//! `rlvr::loss`: custom losses run as the Tinker SDK's `forward_backward_custom` on the local
//! backend (the built-in losses rewritten as custom losses give the built-ins' loss and
//! gradients), and GSPO / Dr. GRPO against a PyTorch autograd reference
//! (`tests/fixtures/custom_loss/make_reference.py`).

use std::collections::BTreeMap;

use crate::local_common::*;
use rlvr::backend::local::{LocalBackend, LocalOptions};
use rlvr::loss::{
    CustomLoss, CustomLossOutput, DrGrpo, Gspo, ImportanceSamplingLoss, PpoLoss,
    forward_backward_custom,
};
use rlvr::types::{Datum, LossFn, ModelInput};
use rlvr::{Error, PolicyBackend};

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// A LoRA backend after one importance-sampling step (the ratios differ from 1 and LoRA's A
/// gets gradients).
async fn stepped() -> LocalBackend {
    let b = backend("untied", LocalOptions::default().lora(lora(4)));
    train_step(&b).await;
    b
}

#[tokio::test]
async fn builtin_losses_as_custom_losses_give_the_builtins_loss_and_gradients() {
    let cases: [(LossFn, &dyn CustomLoss); 2] = [
        (LossFn::ImportanceSampling, &ImportanceSamplingLoss),
        (LossFn::ppo(), &PpoLoss::default()),
    ];
    for (builtin, custom) in cases {
        let a = stepped().await;
        let b = stepped().await;
        let want = a
            .forward_backward(training_data(), builtin)
            .await
            .unwrap()
            .await
            .unwrap();
        let got = forward_backward_custom(&b, training_data(), custom)
            .await
            .unwrap();
        let (lw, lg) = (want.metrics["loss:sum"], got.metrics["loss:sum"]);
        assert!(rel(lg, lw) < 1e-5, "{}: loss {lg} vs {lw}", builtin.name());
        assert!(got.metrics.contains_key("surrogate_loss:sum"));
        if let LossFn::Ppo { .. } = builtin {
            // The data is far enough from the sampler's logprobs that clipping matters.
            let f = got.metrics["ppo/clip_frac:mean"];
            assert!(f > 0.0 && f < 1.0, "clip fraction {f}");
            assert_eq!(Some(&f), want.metrics.get("ppo/clip_frac:mean"));
        }
        let (gw, gg) = (
            a.gradient_norms().await.unwrap(),
            b.gradient_norms().await.unwrap(),
        );
        assert_eq!(gw.keys().collect::<Vec<_>>(), gg.keys().collect::<Vec<_>>());
        let mut worst = 0.0f64;
        for (k, w) in &gw {
            assert!(*w > 0.0, "{k} has no gradient");
            worst = worst.max(rel(gg[k], *w));
        }
        assert!(
            worst < 1e-5,
            "{}: gradient norms differ by {worst:e} (relative)",
            builtin.name()
        );
        // Same direction too: one more optimizer step lands on the same weights.
        a.optim_step(adam()).await.unwrap().await.unwrap();
        b.optim_step(adam()).await.unwrap().await.unwrap();
        let d = max_abs_diff(&probe(&a).await, &probe(&b).await);
        assert!(
            d < 1e-5,
            "{}: logprobs after a step differ by {d}",
            builtin.name()
        );
        eprintln!(
            "{}: loss rel diff {:e}, grad-norm rel diff {worst:e}, probe diff after a step {d:e}",
            builtin.name(),
            rel(lg, lw)
        );
    }
}

/// One case of `tests/fixtures/custom_loss/reference.json`.
struct Case {
    data: Vec<Datum>,
    lp: Vec<Vec<f32>>,
    gspo: (Gspo, f64, Vec<Vec<f64>>),
    dr_grpo: (DrGrpo, f64, Vec<Vec<f64>>),
}

fn reference_cases() -> Vec<Case> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/custom_loss/reference.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let f32s = |x: &serde_json::Value| -> Vec<f32> { serde_json::from_value(x.clone()).unwrap() };
    let expected = |x: &serde_json::Value| -> (f64, Vec<Vec<f64>>) {
        (
            x["loss"].as_f64().unwrap(),
            serde_json::from_value(x["grads"].clone()).unwrap(),
        )
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let mut data = Vec::new();
            let mut lp = Vec::new();
            for d in c["data"].as_array().unwrap() {
                let q = f32s(&d["sampler_logprobs"]);
                let n = q.len();
                data.push(
                    Datum::new(ModelInput::from_tokens(vec![1; n]))
                        .with_target_tokens(vec![2; n])
                        .with_logprobs(q)
                        .with_advantages(f32s(&d["advantages"])),
                );
                lp.push(f32s(&d["lp"]));
            }
            let g = &c["gspo"];
            let (gl, gg) = expected(g);
            let r = &c["dr_grpo"];
            let (rl, rg) = expected(r);
            Case {
                data,
                lp,
                gspo: (
                    Gspo {
                        clip_low: g["clip_low"].as_f64().unwrap(),
                        clip_high: g["clip_high"].as_f64().unwrap(),
                    },
                    gl,
                    gg,
                ),
                dr_grpo: (
                    DrGrpo {
                        normalizer: r["normalizer"].as_f64().unwrap(),
                        clip_low_threshold: r["clip_low_threshold"].as_f64().unwrap(),
                        clip_high_threshold: r["clip_high_threshold"].as_f64().unwrap(),
                    },
                    rl,
                    rg,
                ),
            }
        })
        .collect()
}

/// The largest difference between `got` and `want`, relative to `want`'s largest magnitude.
fn max_rel(got: &[Vec<f32>], want: &[Vec<f64>]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs()));
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (&g, &w) in g.iter().zip(w) {
            worst = worst.max((g as f64 - w).abs() / scale.max(1e-12));
        }
    }
    worst
}

/// A loss's name, the loss, and the expected loss and gradients.
type Run<'a> = (&'a str, &'a dyn CustomLoss, f64, &'a Vec<Vec<f64>>);

#[test]
fn gspo_and_dr_grpo_match_the_pytorch_reference() {
    let cases = reference_cases();
    assert!(cases.len() >= 8);
    let mut worst = BTreeMap::from([("gspo", (0.0f64, 0.0f64)), ("dr_grpo", (0.0, 0.0))]);
    for (i, c) in cases.iter().enumerate() {
        let runs: [Run<'_>; 2] = [
            ("gspo", &c.gspo.0, c.gspo.1, &c.gspo.2),
            ("dr_grpo", &c.dr_grpo.0, c.dr_grpo.1, &c.dr_grpo.2),
        ];
        for (name, loss, want_loss, want_grads) in runs {
            let out = loss.loss(&c.data, &c.lp).unwrap();
            let dl = (out.loss - want_loss).abs() / want_loss.abs().max(1e-12);
            let dg = max_rel(&out.grads, want_grads);
            assert!(
                dl < 1e-6,
                "{name} case {i}: loss {} vs {want_loss}",
                out.loss
            );
            assert!(
                dg < 1e-6,
                "{name} case {i}: gradients differ by {dg:e} (relative)"
            );
            let w = worst.get_mut(name).unwrap();
            *w = (w.0.max(dl), w.1.max(dg));
        }
    }
    eprintln!("max relative differences (loss, grads): {worst:?}");
}

#[tokio::test]
async fn gspo_and_dr_grpo_train_on_the_local_backend() {
    let losses: [&dyn CustomLoss; 2] = [
        &Gspo {
            clip_low: 0.2,
            clip_high: 0.28,
        },
        &DrGrpo::new(64.0),
    ];
    for loss in losses {
        let b = stepped().await;
        let mut data = training_data();
        let lp: Vec<Vec<f32>> = {
            let fwd = b
                .forward(data.clone(), LossFn::ImportanceSampling)
                .await
                .unwrap()
                .await
                .unwrap();
            (0..data.len())
                .map(|i| fwd.logprobs(i).unwrap().to_vec())
                .collect()
        };
        // Trainer-style data: a 2-token prompt (logprob and advantage 0), then sampler
        // logprobs near the learner's (ratios inside the clip range) and one advantage per
        // sequence, of both signs.
        for (i, (d, lp)) in data.iter_mut().zip(&lp).enumerate() {
            let a = if i % 2 == 0 { 1.0 } else { -0.7 };
            let prompt = |t: usize| t < 2;
            let q = (0..lp.len())
                .map(|t| {
                    if prompt(t) {
                        0.0
                    } else {
                        lp[t] - 0.01 * (t % 3) as f32
                    }
                })
                .collect();
            let adv = (0..lp.len())
                .map(|t| if prompt(t) { 0.0 } else { a })
                .collect();
            *d = std::mem::take(d).with_logprobs(q).with_advantages(adv);
        }
        let want = loss.loss(&data, &lp).unwrap().loss;
        let out = forward_backward_custom(&b, data, loss).await.unwrap();
        assert!(want != 0.0 && rel(out.metrics["loss:sum"], want) < 1e-6);
        let norms = b.gradient_norms().await.unwrap();
        assert!(
            !norms.is_empty() && norms.values().all(|n| n.is_finite() && *n > 0.0),
            "{norms:?} {:?}",
            out.metrics
        );
        b.optim_step(adam()).await.unwrap().await.unwrap();
    }
}

/// Returns one gradient too few for datum 1.
struct Short;

impl CustomLoss for Short {
    fn loss(&self, _data: &[Datum], logprobs: &[Vec<f32>]) -> rlvr::Result<CustomLossOutput> {
        let mut grads: Vec<Vec<f32>> = logprobs.iter().map(|lp| vec![0.0; lp.len()]).collect();
        grads[1].pop();
        Ok(CustomLossOutput {
            loss: 0.0,
            grads,
            metrics: BTreeMap::new(),
        })
    }
}

#[tokio::test]
async fn gradients_of_the_wrong_shape_are_a_typed_error_naming_the_datum() {
    let b = backend("untied", LocalOptions::default().lora(lora(4)));
    let e = forward_backward_custom(&b, training_data(), &Short)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CustomLoss { datum: Some(1), .. }), "{e}");
    assert!(e.to_string().contains("datum 1"), "{e}");
    // Nothing was applied.
    assert!(
        b.gradient_norms()
            .await
            .unwrap()
            .values()
            .all(|&n| n == 0.0)
    );
    let mut bare = training_data();
    bare[0].loss_fn_inputs.remove("target_tokens");
    let e = forward_backward_custom(&b, bare, &ImportanceSamplingLoss)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("data[0].loss_fn_inputs.target_tokens"),
        "{e}"
    );
}

/// The example of `docs/training.md` ("Custom losses"), verbatim.
mod docs_example {
    use rlvr::{
        loss::{CustomLoss, CustomLossOutput},
        types::Datum,
    };

    /// −Σ A·lp (REINFORCE on the learner's log-probabilities).
    pub struct Reinforce;
    impl CustomLoss for Reinforce {
        fn loss(&self, data: &[Datum], lp: &[Vec<f32>]) -> rlvr::Result<CustomLossOutput> {
            let mut out = CustomLossOutput::default();
            for (d, lp) in data.iter().zip(lp) {
                let adv = d.advantages().unwrap_or(&[]);
                out.loss -= adv.iter().zip(lp).map(|(a, l)| (a * l) as f64).sum::<f64>();
                out.grads.push(adv.iter().map(|a| -a).collect());
            }
            Ok(out)
        }
    }
}

#[tokio::test]
async fn the_docs_example_is_cross_entropy_weighted_by_the_advantages() {
    let a = stepped().await;
    let b = stepped().await;
    let weighted: Vec<Datum> = training_data()
        .into_iter()
        .map(|d| {
            let w = d.advantages().unwrap().to_vec();
            d.with_weights(w)
        })
        .collect();
    let want = a
        .forward_backward(weighted, LossFn::CrossEntropy)
        .await
        .unwrap()
        .await
        .unwrap();
    let got = forward_backward_custom(&b, training_data(), &docs_example::Reinforce)
        .await
        .unwrap();
    let (lw, lg) = (want.metrics["loss:sum"], got.metrics["loss:sum"]);
    assert!(rel(lg, lw) < 1e-5, "loss {lg} vs {lw}");
    let (gw, gg) = (
        a.gradient_norms().await.unwrap(),
        b.gradient_norms().await.unwrap(),
    );
    for (k, w) in &gw {
        assert!(rel(gg[k], *w) < 1e-5, "{k}: {} vs {w}", gg[k]);
    }
}

/// The trainer over a tiny random LoRA model on `x+x=?` problems, with a graded reward
/// (longer answers score higher, so groups are rarely constant).
mod trainer {
    use std::sync::Arc;

    use rlvr::backend::local::LocalBackend;
    use rlvr::dataset::Problem;
    use rlvr::loss::{Gspo, ImportanceSamplingLoss};
    use rlvr::types::ModelInput;
    use rlvr::{Error, GrpoTrainer, PolicyBackend, RoleColon, Sampler, TrainerConfig};

    type Trainer = GrpoTrainer<LocalBackend, fn(&Problem, &str) -> f64>;

    fn reward(_: &Problem, text: &str) -> f64 {
        text.chars().count() as f64 / 8.0
    }

    fn trainer(config: TrainerConfig) -> Trainer {
        let backend = crate::common::tiny_lora_backend(|o| o);
        let renderer = Arc::new(RoleColon::new(backend.tokenizer().clone()));
        let problems: Arc<dyn rlvr::Dataset> = Arc::new(
            (0..6)
                .map(|i| Problem::new(format!("p{i}"), format!("{i}+{i}=?"), format!("{}", 2 * i)))
                .collect::<Vec<_>>(),
        );
        let reward: fn(&Problem, &str) -> f64 = reward;
        GrpoTrainer::new(backend, reward, renderer, problems, config).unwrap()
    }

    fn config() -> rlvr::trainer::TrainerConfigBuilder {
        TrainerConfig::builder()
            .batch_size(2)
            .group_size(4)
            .max_tokens(6)
            .learning_rate(1e-2)
            .num_minibatches(2)
            .eval_every(0)
            .save_every(0)
            .progress(false)
    }

    /// The learner's log-probabilities of a fixed sequence: a fingerprint of the weights.
    async fn fingerprint(t: &Trainer) -> Vec<f64> {
        let input = ModelInput::from_tokens((1..20).collect());
        let sampler = t.backend().sampler().await.unwrap();
        let lps = sampler.compute_logprobs(&input).await.unwrap();
        lps.into_iter().flatten().map(f64::from).collect()
    }

    /// Relative difference, absolute below 1 (an on-policy step's importance-sampling loss
    /// is a sum of advantages, 0 up to rounding).
    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(1.0)
    }

    /// Two steps with `ImportanceSamplingLoss` as a custom loss log the built-in
    /// `importance_sampling` run's metrics and end at its weights (to 1e-5 relative, absolute
    /// below 1); the
    /// custom run also logs the backend's cross-entropy as `optim/surrogate_loss:sum`.
    #[tokio::test]
    async fn importance_sampling_as_a_custom_loss_trains_as_the_builtin() {
        let mut builtin = trainer(config().seed(3).build().unwrap());
        let mut custom = trainer(config().seed(3).build().unwrap())
            .with_custom_loss(ImportanceSamplingLoss)
            .unwrap();
        for step in 0..2 {
            let want = builtin.step().await.unwrap();
            let got = custom.step().await.unwrap();
            assert!(want.datums > 0, "step {step}: nothing trained");
            for (k, w) in &want.values {
                if k.starts_with("time/") {
                    continue;
                }
                let g = got.values.get(k).unwrap_or_else(|| panic!("no {k}"));
                assert!(rel(*g, *w) < 1e-5, "step {step} {k}: {g} vs {w}");
            }
            assert!(got.values["optim/surrogate_loss:sum"].is_finite());
            assert!(!want.values.contains_key("optim/surrogate_loss:sum"));
        }
        let (w, g) = (fingerprint(&builtin).await, fingerprint(&custom).await);
        assert_eq!(w.len(), g.len());
        let moved = trainer(config().build().unwrap());
        let before = fingerprint(&moved).await;
        assert!(
            w.iter().zip(&before).any(|(a, b)| rel(*a, *b) > 1e-3),
            "training did not move the weights"
        );
        for (a, b) in g.iter().zip(&w) {
            assert!(rel(*a, *b) < 1e-5, "logprob {a} vs {b}");
        }
    }

    /// A GSPO run trains (the weights move) and writes the loss's metrics to
    /// `metrics.jsonl` under `optim/`.
    #[tokio::test]
    async fn a_gspo_run_logs_its_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config().log_dir(dir.path()).build().unwrap();
        let mut t = trainer(cfg)
            .with_custom_loss(Gspo {
                clip_low: 0.2,
                clip_high: 0.2,
            })
            .unwrap();
        let before = fingerprint(&t).await;
        for _ in 0..2 {
            let m = t.step().await.unwrap();
            assert!(m.datums > 0);
        }
        let after = fingerprint(&t).await;
        assert!(before.iter().zip(&after).any(|(a, b)| rel(*a, *b) > 1e-4));
        let rows: Vec<serde_json::Value> =
            std::fs::read_to_string(dir.path().join("metrics.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        assert_eq!(rows.len(), 2);
        for row in &rows {
            for key in [
                "optim/loss:sum",
                "optim/surrogate_loss:sum",
                "optim/gspo/ratio:mean",
                "optim/gspo/clip_frac:mean",
            ] {
                assert!(row[key].is_number(), "{key} missing from {row}");
            }
            // Averaged over the minibatches, not summed.
            let f = row["optim/gspo/clip_frac:mean"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&f), "{f}");
        }
    }

    /// Streaming minibatches submits each minibatch's forward_backward during the rollout,
    /// which a custom loss cannot do: refused with a typed error naming the option.
    #[tokio::test]
    async fn a_custom_loss_with_streamed_minibatches_is_a_config_error() {
        let cfg = config().stream_minibatches(true).build().unwrap();
        let e = trainer(cfg)
            .with_custom_loss(ImportanceSamplingLoss)
            .unwrap_err();
        assert!(
            matches!(&e, Error::Config { field, .. } if field == "stream_minibatches"),
            "{e}"
        );
    }
}
