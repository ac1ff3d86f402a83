//! Helpers of the local backend's tests (`local_backend.rs` on the CPU, `local_cuda.rs` on a
//! GPU): the `qwen3-tiny` fixtures with transformers' logits, fixed training data, probes.

use std::path::PathBuf;

use std::collections::BTreeMap;

use rlvr::backend::local::{LocalBackend, LocalOptions};
use rlvr::{
    PolicyBackend, Sampler,
    types::{
        AdamParams, Datum, LoraConfig, LossFn, ModelInput, SampledSequence, SamplingParams,
        StopCondition, TensorData,
    },
};

/// `tests/fixtures/qwen3-tiny/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen3-tiny")
        .join(name)
}

/// A fixture's inputs and transformers' logits for them.
pub struct HfCase {
    pub input_ids: Vec<Vec<u32>>,
    pub logits: Vec<Vec<Vec<f32>>>,
}

pub fn hf_case(name: &str) -> HfCase {
    let text = std::fs::read_to_string(fixture(name).join("inputs.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    HfCase {
        input_ids: serde_json::from_value(v["input_ids"].clone()).unwrap(),
        logits: serde_json::from_value(v["logits"].clone()).unwrap(),
    }
}

/// LoRA of `rank` with a fixed seed.
pub fn lora(rank: u32) -> LoraConfig {
    LoraConfig {
        rank,
        seed: Some(7),
        ..LoraConfig::default()
    }
}

/// The two training modes the tests cover: LoRA rank 4 ([`lora`]) and full fine-tuning.
pub fn lora_and_full() -> [LocalOptions; 2] {
    [
        LocalOptions::default().lora(lora(4)),
        LocalOptions::default().full_finetune(),
    ]
}

/// The fixture `name` loaded with `opts` (on the device `opts` names).
pub fn backend(name: &str, opts: LocalOptions) -> LocalBackend {
    let device = opts.device;
    LocalBackend::from_dir(fixture(name), opts)
        .unwrap_or_else(|e| panic!("loading `{name}` on {device:?}: {e}"))
}

pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    row.iter().map(|&x| x as f64 - lse).collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// An importance-sampling datum over `tokens` with fixed pseudo-random advantages.
pub fn is_datum(tokens: &[u32], salt: usize) -> Datum {
    let n = tokens.len() - 1;
    let input = ModelInput::from_tokens(tokens[..n].to_vec());
    let targets: Vec<i64> = tokens[1..].iter().map(|&t| t as i64).collect();
    let adv: Vec<f32> = (0..n)
        .map(|i| (((i * 7 + salt * 3) % 5) as f32 - 2.0) * 0.5)
        .collect();
    Datum::new(input)
        .with_target_tokens(targets)
        .with_logprobs(vec![-1.0; n])
        .with_advantages(adv)
}

/// A cross-entropy datum over `tokens` (every target weighted 1).
pub fn ce_datum(tokens: &[u32]) -> Datum {
    let n = tokens.len() - 1;
    Datum::new(ModelInput::from_tokens(tokens[..n].to_vec()))
        .with_input(
            "target_tokens",
            TensorData::i64(tokens[1..].iter().map(|&t| t as i64).collect()),
        )
        .with_weights(vec![1.0; n])
}

/// Importance-sampling datums over the `untied` fixture's inputs.
pub fn training_data() -> Vec<Datum> {
    let case = hf_case("untied");
    case.input_ids
        .iter()
        .enumerate()
        .map(|(i, ids)| is_datum(ids, i))
        .collect()
}

pub fn adam() -> AdamParams {
    AdamParams {
        learning_rate: 1e-2,
        ..AdamParams::default()
    }
}

/// The learner's logprobs of a fixed probe.
pub async fn probe(b: &LocalBackend) -> Vec<f32> {
    let case = hf_case("untied");
    let out = b
        .forward(vec![ce_datum(&case.input_ids[0])], LossFn::CrossEntropy)
        .await
        .unwrap()
        .await
        .unwrap();
    out.loss_fn_outputs[0]["logprobs"]
        .as_f32()
        .unwrap()
        .to_vec()
}

/// One importance-sampling step on [`training_data`] (`forward_backward` + `optim_step`);
/// returns the loss.
pub async fn train_step(b: &LocalBackend) -> f64 {
    let out = b
        .forward_backward(training_data(), LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap();
    b.optim_step(adam()).await.unwrap().await.unwrap();
    out.metrics["loss:sum"]
}

/// The gradient norms of [`training_data`] after one [`train_step`] (after it, LoRA's B is
/// no longer zero, so A gets a gradient too). Used by `local_cuda.rs` only.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub async fn gradients_after_a_step(b: &LocalBackend) -> BTreeMap<String, f64> {
    train_step(b).await;
    b.forward_backward(training_data(), LossFn::ImportanceSampling)
        .await
        .unwrap()
        .await
        .unwrap();
    b.gradient_norms().await.unwrap()
}

/// The fixtures `untied` and `tied` loaded with `opts`: the sampler's logits and the
/// trainer's log-probabilities (the training path's ops) are transformers' within `tol`.
pub async fn check_against_transformers(opts: &LocalOptions, tol: f32) {
    for name in ["untied", "tied"] {
        let case = hf_case(name);
        let b = backend(name, opts.clone());
        let sampler = b.sampler().await.unwrap();
        for (ids, want) in case.input_ids.iter().zip(&case.logits) {
            let got = sampler.logits_blocking(ids).unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                let d = max_abs_diff(g, w);
                assert!(d < tol, "{name} on {:?}: logits differ by {d}", opts.device);
            }
            let out = b
                .forward(vec![ce_datum(ids)], LossFn::CrossEntropy)
                .await
                .unwrap()
                .await
                .unwrap();
            let lp = out.loss_fn_outputs[0]["logprobs"].as_f32().unwrap();
            for (t, &l) in lp.iter().enumerate() {
                let want = log_softmax(&want[t])[ids[t + 1] as usize];
                assert!(
                    (l as f64 - want).abs() < tol as f64,
                    "{name} on {:?}: trainer logprob {l} vs transformers {want} at {t}",
                    opts.device
                );
            }
        }
    }
}

/// The prompt of [`check_sampler_against_trainer`].
pub const SAMPLE_PROMPT: [u32; 4] = [5, 9, 17, 33];

/// Samples 4 sequences of 12 tokens after [`SAMPLE_PROMPT`] from `b`'s current weights (seed
/// 3, no stop) and checks that the sampler's log-probabilities are the trainer's within
/// `tol`. Returns the sequences.
pub async fn check_sampler_against_trainer(b: &LocalBackend, tol: f32) -> Vec<SampledSequence> {
    let sampler = b.sampler().await.unwrap();
    let params = SamplingParams::default()
        .max_tokens(12)
        .seed(3)
        .stop(StopCondition::Strings(vec![]));
    let seqs = sampler
        .sample(&ModelInput::from_tokens(SAMPLE_PROMPT.to_vec()), 4, &params)
        .await
        .unwrap();
    assert_eq!(seqs.len(), 4);
    for s in &seqs {
        assert_eq!(s.tokens.len(), 12);
        assert_eq!(s.logprobs.len(), 12);
        let mut all = SAMPLE_PROMPT.to_vec();
        all.extend(&s.tokens);
        let out = b
            .forward(vec![ce_datum(&all)], LossFn::CrossEntropy)
            .await
            .unwrap()
            .await
            .unwrap();
        let lp = out.loss_fn_outputs[0]["logprobs"].as_f32().unwrap();
        let d = max_abs_diff(&lp[SAMPLE_PROMPT.len() - 1..], &s.logprobs);
        assert!(d < tol, "sampler vs trainer logprobs differ by {d}");
    }
    seqs
}
