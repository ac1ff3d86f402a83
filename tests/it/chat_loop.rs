//! A thinking chat renderer in the training loop, on the local backend: a tiny Qwen3 model
//! whose tokenizer has Qwen3's chat special tokens (`<|im_start|>`, `<|im_end|>`, `<think>`,
//! …) learns one reasoning answer from the renderer's own supervised example, then
//! `GrpoTrainer` runs with the `qwen3` renderer. Rewards see the final text only (the
//! thinking removed), responses cut inside `<think>` are malformed, and the metrics keep the
//! cookbook's names.

use std::sync::{Arc, Mutex};

use rlvr::Dataset;
use rlvr::backend::local::{LocalBackend, LocalOptions, Qwen3Config};
use rlvr::{
    GrpoTrainer, PolicyBackend, TrainerConfig,
    dataset::Problem,
    message::{ContentPart, Message},
    renderer::{ParseTermination, TrainOnWhat},
    tokenizer::Tokenizer,
    types::{AdamParams, Datum, LossFn, ModelInput, TensorData},
};

const SPECIALS: &[&str] = &[
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
];

/// One token per printable ASCII character and `\n`, plus Qwen3's chat special tokens;
/// EOS `<|im_end|>`.
fn chat_tokenizer() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    let chars: Vec<String> = std::iter::once('\n')
        .chain(' '..='~')
        .map(String::from)
        .collect();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.clone(), i.into());
    }
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::json!({"id": chars.len() + i, "content": s, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": null,
        "post_processor": null, "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": " "},
    });
    let tok = Tokenizer::from_bytes(json.to_string().as_bytes()).expect("tokenizer");
    let eos = tok.token_to_id("<|im_end|>");
    tok.with_eos(eos)
}

struct OneProblem;

impl Dataset for OneProblem {
    fn len(&self) -> usize {
        4
    }
    fn get(&self, index: usize) -> rlvr::Result<Problem> {
        Ok(Problem::new(format!("p{index}"), "What is 2+2?", "4"))
    }
}

const THINKING: &str = "2 and 2 make 4.";
const ANSWER: &str = "\\boxed{4}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpo_with_a_thinking_chat_renderer_on_the_local_backend() {
    let tok = chat_tokenizer();
    let renderer = rlvr::renderer::by_name("qwen3", tok.clone()).expect("qwen3 renderer");
    assert_eq!(renderer.name(), "qwen3");
    let cfg = Qwen3Config::new(
        tok.vocab_size().next_multiple_of(8),
        32,
        64,
        2,
        4,
        2,
        8,
        256,
    );
    let backend = LocalBackend::random(
        cfg,
        tok.clone(),
        LocalOptions::default().full_finetune().seed(3),
    )
    .expect("tiny model");

    // Teach the model one reasoning answer with the renderer's own supervised example.
    let conversation = [
        Message::user("What is 2+2?"),
        Message::assistant(vec![
            ContentPart::thinking(THINKING),
            ContentPart::text(ANSWER),
        ]),
    ];
    let (input, weights) = renderer
        .supervised_example(&conversation, TrainOnWhat::LastAssistantMessage)
        .expect("supervised example");
    let tokens = input.to_tokens();
    assert!(weights.iter().any(|&w| w > 0.0));
    let n = tokens.len() - 1;
    let datum = Datum::new(ModelInput::from_tokens(tokens[..n].to_vec()))
        .with_input(
            "target_tokens",
            TensorData::i64(tokens[1..].iter().map(|&t| t as i64).collect()),
        )
        .with_weights(weights[1..].to_vec());
    let adam = AdamParams {
        learning_rate: 1e-2,
        ..AdamParams::default()
    };
    for _ in 0..60 {
        let fb = backend
            .forward_backward(vec![datum.clone()], LossFn::CrossEntropy)
            .await
            .expect("submit");
        let opt = backend.optim_step(adam).await.expect("submit");
        fb.await.expect("fwd/bwd");
        opt.await.expect("optim");
    }

    // GRPO with the chat renderer: record what the reward sees.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen_in_reward = Arc::clone(&seen);
    let reward = move |p: &Problem, text: &str| {
        seen_in_reward.lock().unwrap().push(text.to_owned());
        if text.contains(&format!("\\boxed{{{}}}", p.answer)) {
            1.0
        } else {
            0.0
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let config = TrainerConfig::builder()
        .batch_size(2)
        .group_size(4)
        .max_tokens(48)
        .temperature(0.7)
        .learning_rate(1e-3)
        .max_steps(3)
        .save_every(0)
        .log_dir(dir.path())
        .build()
        .unwrap();
    let mut trainer = GrpoTrainer::new(
        backend,
        reward,
        Arc::clone(&renderer),
        Arc::new(OneProblem),
        config,
    )
    .expect("trainer");
    trainer.run().await.expect("run");

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3 * 2 * 4, "every sample graded");
    assert!(
        seen.iter()
            .all(|t| !t.contains("<think>") && !t.contains(THINKING)),
        "rewards saw thinking: {seen:?}"
    );
    assert!(
        seen.iter().filter(|t| t.contains(ANSWER)).count() >= seen.len() / 2,
        "the taught answer should dominate: {seen:?}"
    );
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    for key in [
        "env/all/reward/total",
        "env/all/by_group/frac_mixed",
        "env/all/ac_tokens_per_turn",
        "env/all/parse_clean",
    ] {
        assert!(
            rows[0].get(key).is_some(),
            "metric {key} missing: {}",
            rows[0]
        );
    }
    let config_json = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    assert!(
        config_json.contains("qwen3"),
        "config.json records the renderer: {config_json}"
    );

    // A response cut inside the think block is malformed, and what a reward grades of it
    // holds no reasoning (the cookbook would grade the reasoning text itself).
    let mut cut = tok.encode("<think>").unwrap();
    cut.extend(tok.encode(&format!("{THINKING} so {ANSWER}")).unwrap());
    let (message, termination) = renderer.parse_response(&cut);
    assert_eq!(termination, ParseTermination::Malformed);
    assert_eq!(message.final_text(), "", "{message:?}");
}
