//! Regenerates the embedded tiny model in `assets/tiny-wordproblems/`.
//!
//! 1. Trains a small byte-level BPE tokenizer (the `tokenizers` crate) on the synthetic word
//!    problems rendered in the role-colon format.
//! 2. Builds a tiny Qwen3-architecture configuration over that vocabulary, initialises it at
//!    random with the local backend, and fine-tunes every parameter through the backend's own
//!    `cross_entropy` path on the train split of `WordProblems`.
//! 3. Exports config.json, model.safetensors, tokenizer.json, tokenizer_config.json and a
//!    README with the provenance.
//!
//! The supervised target is an *unreliable teacher*: every completion has the exact output
//! format (` The answer is \boxed{N}.` then the role-colon stop), but N is the correct answer
//! only a fraction of the time (`--p-correct`) and otherwise a plausible wrong number (an
//! operand, the answer off by one, the other operation's result). The model learns the format
//! and the arithmetic yet hedges between candidates, so its accuracy at temperature 1 is low
//! while the correct answer is among a few samples most of the time: exactly the situation in
//! which GRPO visibly learns, which is what the quickstart demonstrates.
//!
//! ```text
//! cargo run --release --example make_tiny_model
//! ```

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rlvr::dataset::word_problems::{answer_text, Arithmetic, MAX_OPERAND};
use rlvr::dataset::{Dataset, WordProblems};
use rlvr::renderer::{Renderer, RoleColon, TrainOnWhat};
use rlvr::types::Message;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder};

/// The end-of-text special token of the tiny tokenizer.
const EOS: &str = "<|endoftext|>";

#[derive(Parser, Debug)]
#[command(about = "Regenerate the embedded tiny word-problem model")]
struct Args {
    /// Output directory.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/tiny-wordproblems"))]
    out: PathBuf,
    /// Seed of the word-problem set (the quickstart uses the same seed and split).
    #[arg(long, default_value_t = 0)]
    data_seed: u64,
    /// Problems held out as the test split (never seen in fine-tuning).
    #[arg(long, default_value_t = 1000)]
    test_size: usize,
    /// Seed of the teacher's answer choice, the initialisation and the batch order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Target vocabulary size of the BPE tokenizer (256 byte symbols + merges + EOS).
    #[arg(long, default_value_t = 512)]
    vocab_size: usize,
    /// Probability that the teacher's answer is the correct one.
    #[arg(long, default_value_t = 0.22)]
    p_correct: f64,
    /// Write the supervised examples (tokens + weights, JSONL) here and stop after the
    /// tokenizer (for prototyping / the PyTorch benchmark).
    #[arg(long)]
    dump_sft: Option<PathBuf>,
}

/// Trains the byte-level BPE tokenizer on the train split, in the pieces the role-colon
/// renderer tokenizes separately (`User:`, ` question\n\n`, `Assistant:`, ` answer\n\n`).
fn train_tokenizer(
    train: &WordProblems,
    vocab_size: usize,
    out: &std::path::Path,
) -> Result<rlvr::Tokenizer> {
    let mut corpus = Vec::with_capacity(4 * train.len());
    for p in train.problems() {
        corpus.push("User:".to_string());
        corpus.push(format!(" {}\n\n", p.question));
        corpus.push("Assistant:".to_string());
        corpus.push(format!(" {}\n\n", answer_text(p.answer.parse()?)));
    }
    // Every number the teacher may answer (0 ..= 2 * MAX_OPERAND + 1) gets its own token.
    for n in 0..=2 * MAX_OPERAND + 1 {
        for _ in 0..2 {
            corpus.push(format!(" {}\n\n", answer_text(n)));
        }
    }
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOS, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect::<HashSet<char>>())
        .build();
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_post_processor(Some(ByteLevel::default().trim_offsets(false)))
        .with_decoder(Some(ByteLevel::default()))
        .build()
        .map_err(anyhow::Error::msg)?;
    tokenizer
        .train(&mut trainer, corpus.iter())
        .map_err(anyhow::Error::msg)?;
    let tokenizer: tokenizers::Tokenizer = tokenizer.into();

    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("tokenizer.json");
    tokenizer
        .save(&path, true)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("writing {}", path.display()))?;
    let config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": null,
        "pad_token": EOS,
        "add_bos_token": false,
        "model_max_length": 512,
    });
    std::fs::write(
        out.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config)? + "\n",
    )?;
    Ok(rlvr::Tokenizer::from_file(&path)?)
}

/// The teacher's number for a problem: correct with probability `p_correct`, otherwise a
/// plausible wrong number.
fn teacher_answer(a: &Arithmetic, p_correct: f64, rng: &mut ChaCha8Rng) -> u32 {
    let correct = a.answer();
    if rng.random_bool(p_correct) {
        return correct;
    }
    let mut wrong: Vec<u32> = vec![a.left, a.right, correct + 1];
    if let Some(c) = correct.checked_sub(1) {
        wrong.push(c);
    }
    if let Some(o) = a.other_operation() {
        wrong.push(o);
    }
    wrong.retain(|&w| w != correct);
    wrong.sort_unstable();
    wrong.dedup();
    wrong[rng.random_range(0..wrong.len() as u32) as usize]
}

/// One supervised example: the tokens and the per-token weights (on the answer + stop).
struct Example {
    tokens: Vec<u32>,
    weights: Vec<f32>,
    answer: String,
}

fn sft_examples(
    train: &WordProblems,
    renderer: &RoleColon,
    p_correct: f64,
    seed: u64,
) -> Result<Vec<Example>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(train.len());
    for i in 0..train.len() {
        let p = train.get(i)?;
        let a = train
            .arithmetic(i)
            .context("arithmetic of a train problem")?;
        let n = teacher_answer(&a, p_correct, &mut rng);
        let mut messages = p.messages.clone();
        messages.push(Message::assistant(answer_text(n)));
        let (input, weights) =
            renderer.supervised_example(&messages, TrainOnWhat::LastAssistantMessage)?;
        out.push(Example {
            tokens: input.to_tokens(),
            weights,
            answer: p.answer,
        });
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let all = WordProblems::new(args.data_seed, WordProblems::space_size())?;
    let (train, test) = all.split(args.test_size)?;
    let tokenizer = train_tokenizer(&train, args.vocab_size, &args.out)?;
    println!(
        "tokenizer: {} tokens, eos {:?}",
        tokenizer.vocab_size(),
        tokenizer.eos_token_id()
    );
    let renderer = RoleColon::new(tokenizer.clone());
    let examples = sft_examples(&train, &renderer, args.p_correct, args.seed)?;
    let mean_len =
        examples.iter().map(|e| e.tokens.len()).sum::<usize>() as f64 / examples.len() as f64;
    println!(
        "{} supervised examples, {:.1} tokens on average; {} test problems held out",
        examples.len(),
        mean_len,
        test.len()
    );
    if let Some(path) = &args.dump_sft {
        let mut text = String::new();
        for e in &examples {
            text += &serde_json::to_string(&serde_json::json!({
                "tokens": e.tokens, "weights": e.weights, "answer": e.answer
            }))?;
            text.push('\n');
        }
        std::fs::write(path, text)?;
        let mut text = String::new();
        for p in test.problems() {
            let prompt = renderer.generation_prompt(&p.messages)?.to_tokens();
            text += &serde_json::to_string(&serde_json::json!({
                "prompt": prompt, "answer": p.answer
            }))?;
            text.push('\n');
        }
        std::fs::write(path.with_extension("test.jsonl"), text)?;
        println!("wrote {}", path.display());
        return Ok(());
    }
    Ok(())
}
