//! Regenerates the embedded tiny model in `examples/tiny-wordproblems/`.
//!
//! 1. Trains a small byte-level BPE tokenizer (the `tokenizers` crate; numbers split off as
//!    their own pre-tokens) on the synthetic word problems in the role-colon pieces.
//! 2. Builds a tiny Qwen3-architecture configuration over that vocabulary, initialises it at
//!    random with the local backend, and fine-tunes every parameter through the backend's own
//!    `cross_entropy` path on the train split of `WordProblems`.
//! 3. Exports config.json, model.safetensors, tokenizer.json, tokenizer_config.json and a
//!    README with the provenance.
//!
//! The supervised target is an *unreliable teacher*: every completion has the exact output
//! format (` The answer is \boxed{N}.` then the role-colon stop), but N is the correct answer
//! only a fraction of the time (`--p-correct`) and otherwise a plausible wrong number (an
//! operand or the other operation's result; `--off-by-one` adds the answer ± 1). The model
//! learns the format and the arithmetic yet hedges between candidates, so its accuracy at
//! temperature 1 is low while the correct answer is among a few samples most of the time:
//! exactly the situation in which GRPO visibly learns, which the quickstart demonstrates.
//!
//! ```text
//! cargo run --release --example make_tiny_model
//! ```

use std::collections::HashSet;
use std::path::PathBuf;

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rlvr::backend::local::{LocalBackend, LocalOptions, Qwen3Config};
use rlvr::dataset::word_problems::{answer_text, Arithmetic, MAX_OPERAND};
use rlvr::message::Message;
use rlvr::reward::extract_boxed;
use rlvr::{dataset::word_problems::WordProblems, Dataset};
use rlvr::{renderer::TrainOnWhat, Renderer, RoleColon};
use rlvr::{
    types::{AdamParams, Datum, LossFn, ModelInput, SamplingParams, TensorData},
    PolicyBackend, Sampler,
};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, TokenizerBuilder};

/// The end-of-text special token of the tiny tokenizer.
const EOS: &str = "<|endoftext|>";

/// How the teacher writes its completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Teacher {
    /// Per example, either the worked style ` 7 + 5 = 12. The answer is \boxed{12}.`
    /// (probability `--p-work`, always correct) or the guess style
    /// ` The answer is \boxed{7}.` (the first number of the question, always wrong).
    Strategy,
    /// Always ` The answer is \boxed{N}.`, N correct with probability `--p-correct`.
    Unreliable,
}

/// The worked completion: the arithmetic written out, then the answer.
fn worked_text(a: &Arithmetic) -> String {
    format!(
        "{} {} {} = {}. {}",
        a.left,
        a.op.symbol(),
        a.right,
        a.answer(),
        answer_text(a.answer())
    )
}

/// The guess completion: the first number of the question as the answer (never correct,
/// since both operands are at least 1).
fn guess_text(a: &Arithmetic) -> String {
    answer_text(a.left)
}

#[derive(Parser, Debug)]
#[command(about = "Regenerate the embedded tiny word-problem model")]
struct Args {
    /// Output directory.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tiny-wordproblems"))]
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
    /// The teacher: `strategy` (two completion styles, see the module docs) or `unreliable`
    /// (one style, a correct number with probability `--p-correct`).
    #[arg(long, value_enum, default_value_t = Teacher::Strategy)]
    teacher: Teacher,
    /// Probability of the teacher's "show the work" (correct) style (`--teacher strategy`).
    #[arg(long, default_value_t = 0.2)]
    p_work: f64,
    /// Fraction of supervised examples in the worked style (`--teacher strategy`; default
    /// `--p-work`). When it exceeds `--p-work`, the first completion token (the choice of
    /// style) of some worked examples gets weight 0, so the model still starts the worked
    /// style with probability `--p-work` while it sees more worked arithmetic.
    #[arg(long)]
    p_work_data: Option<f64>,
    /// Start from this model directory (its tokenizer and weights) instead of a new
    /// tokenizer and a random initialisation.
    #[arg(long)]
    init: Option<PathBuf>,
    /// Probability that the teacher's answer is the correct one (`--teacher unreliable`).
    #[arg(long, default_value_t = 0.25)]
    p_correct: f64,
    /// Let the teacher's wrong answers include the answer ± 1 (besides the operands and the
    /// other operation's result). Off by default: GRPO separates the correct answer from
    /// its neighbours much more slowly than from an operand.
    #[arg(long)]
    off_by_one: bool,
    /// Hidden size of the model.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// MLP intermediate size.
    #[arg(long, default_value_t = 256)]
    intermediate: usize,
    /// Decoder layers.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Attention heads (head dim = hidden / heads).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Key/value heads.
    #[arg(long, default_value_t = 2)]
    kv_heads: usize,
    /// Fine-tuning steps.
    #[arg(long, default_value_t = 3000)]
    steps: usize,
    /// Examples per step.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Peak learning rate (linear warm-up, cosine decay to 10%).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// Held-out problems sampled for the before/after measurement.
    #[arg(long, default_value_t = 200)]
    eval_problems: usize,
    /// Samples per held-out problem in the measurement (accuracy at T=1 and pass@k).
    #[arg(long, default_value_t = 8)]
    eval_samples: usize,
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
) -> Result<rlvr::tokenizer::Tokenizer> {
    let mut corpus = Vec::with_capacity(4 * train.len());
    for p in train.problems() {
        corpus.push("User:".to_string());
        corpus.push(format!(" {}\n\n", p.question));
        corpus.push("Assistant:".to_string());
        corpus.push(format!(" {}\n\n", answer_text(p.answer.parse()?)));
    }
    for i in 0..train.len() {
        if let Some(a) = train.arithmetic(i) {
            corpus.push(format!(" {}\n\n", worked_text(&a)));
        }
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
        .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            // Numbers stand alone, without the space before them: `3` is the same token in
            // the question and inside `\boxed{}`, which makes the arithmetic easier to learn.
            Split::new(
                SplitPattern::Regex("[0-9]+".into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(anyhow::Error::msg)?
            .into(),
            ByteLevel::default().add_prefix_space(false).into(),
        ]))))
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
    Ok(rlvr::tokenizer::Tokenizer::from_file(&path)?)
}

/// The teacher's number for a problem: correct with probability `p_correct`, otherwise a
/// plausible wrong number.
fn teacher_answer(a: &Arithmetic, p_correct: f64, off_by_one: bool, rng: &mut ChaCha8Rng) -> u32 {
    let correct = a.answer();
    if rng.random_bool(p_correct) {
        return correct;
    }
    let mut wrong: Vec<u32> = vec![a.left, a.right];
    if off_by_one {
        wrong.push(correct + 1);
        if let Some(c) = correct.checked_sub(1) {
            wrong.push(c);
        }
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

fn sft_examples(train: &WordProblems, renderer: &RoleColon, args: &Args) -> Result<Vec<Example>> {
    let seed = args.seed;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(train.len());
    for i in 0..train.len() {
        let p = train.get(i)?;
        let a = train
            .arithmetic(i)
            .context("arithmetic of a train problem")?;
        let p_data = args.p_work_data.unwrap_or(args.p_work);
        // Share of the worked examples whose first token is supervised, so that the
        // supervised first tokens are worked with probability `p_work`.
        let keep = if p_data > 0.0 && p_data < 1.0 {
            (args.p_work * (1.0 - p_data) / (p_data * (1.0 - args.p_work))).min(1.0)
        } else {
            1.0
        };
        let (text, mask_first) = match args.teacher {
            Teacher::Strategy => {
                if rng.random_bool(p_data) {
                    (worked_text(&a), !rng.random_bool(keep))
                } else {
                    (guess_text(&a), false)
                }
            }
            Teacher::Unreliable => (
                answer_text(teacher_answer(
                    &a,
                    args.p_correct,
                    args.off_by_one,
                    &mut rng,
                )),
                false,
            ),
        };
        let mut messages = p.messages.clone();
        messages.push(Message::assistant(text));
        let (input, mut weights) =
            renderer.supervised_example(&messages, TrainOnWhat::LastAssistantMessage)?;
        if mask_first {
            if let Some(w) = weights.iter_mut().find(|w| **w > 0.0) {
                *w = 0.0;
            }
        }
        out.push(Example {
            tokens: input.to_tokens(),
            weights,
            answer: p.answer,
        });
    }
    Ok(out)
}

/// What [`measure`] found.
struct Measured {
    /// Fraction of correct samples.
    accuracy: f64,
    /// Fraction of problems with at least one correct sample.
    pass_at_k: f64,
    /// Fraction of samples in the worked style (the content starts with a digit).
    worked: f64,
    /// Accuracy of the worked-style samples.
    worked_accuracy: f64,
}

/// Accuracy at temperature 1, pass@k and the worked-style statistics of the backend's
/// current weights on `problems`.
async fn measure(
    backend: &LocalBackend,
    renderer: &RoleColon,
    problems: &WordProblems,
    n_problems: usize,
    k: usize,
    seed: u64,
) -> Result<Measured> {
    let sampler = backend.sampler().await?;
    let params = SamplingParams::default()
        .max_tokens(32)
        .temperature(1.0)
        .seed(seed)
        .stop(renderer.stop());
    let (mut correct, mut solved, mut total) = (0usize, 0usize, 0usize);
    let (mut worked, mut worked_correct) = (0usize, 0usize);
    for p in problems.problems().take(n_problems) {
        let prompt = renderer.generation_prompt(&p.messages)?;
        let samples = sampler.sample(&prompt, k, &params).await?;
        let mut any = false;
        for s in &samples {
            let (message, _) = renderer.parse_response(&s.tokens);
            let ok = extract_boxed(&message.text()).as_deref() == Some(p.answer.as_str());
            correct += ok as usize;
            any |= ok;
            if message
                .text()
                .trim_start()
                .starts_with(|c: char| c.is_ascii_digit())
            {
                worked += 1;
                worked_correct += ok as usize;
            }
            total += 1;
        }
        solved += any as usize;
    }
    Ok(Measured {
        accuracy: correct as f64 / total.max(1) as f64,
        pass_at_k: solved as f64 / n_problems.min(problems.len()).max(1) as f64,
        worked: worked as f64 / total.max(1) as f64,
        worked_accuracy: worked_correct as f64 / worked.max(1) as f64,
    })
}

fn datum(e: &Example) -> Datum {
    let n = e.tokens.len();
    Datum::new(ModelInput::from_tokens(e.tokens[..n - 1].to_vec()))
        .with_input(
            "target_tokens",
            TensorData::i64(e.tokens[1..].iter().map(|&t| t as i64).collect()),
        )
        .with_input("weights", TensorData::f32(e.weights[1..].to_vec()))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let all = WordProblems::new(args.data_seed, WordProblems::space_size())?;
    let (train, test) = all.split(args.test_size)?;
    // The tokenizer goes to a scratch directory; `export_hf` writes the final directory in one
    // rename, so a failed run leaves the committed model untouched.
    let scratch = tempfile::tempdir()?;
    let tokenizer = match &args.init {
        Some(dir) => rlvr::tokenizer::Tokenizer::from_file(dir.join("tokenizer.json"))?,
        None => train_tokenizer(&train, args.vocab_size, scratch.path())?,
    };
    println!(
        "tokenizer: {} tokens, eos {:?}",
        tokenizer.vocab_size(),
        tokenizer.eos_token_id()
    );
    let renderer = RoleColon::new(tokenizer.clone());
    let examples = sft_examples(&train, &renderer, &args)?;
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

    let config = Qwen3Config::new(
        tokenizer.vocab_size(),
        args.hidden,
        args.intermediate,
        args.layers,
        args.heads,
        args.kv_heads,
        args.hidden / args.heads,
        256,
    )
    .with_tied_embeddings(true)
    .with_rope_theta(10_000.0)
    .with_eos(tokenizer.eos_token_id());
    let options = LocalOptions::default().full_finetune().seed(args.seed);
    let backend = match &args.init {
        Some(dir) => LocalBackend::from_dir(dir, options)?,
        None => LocalBackend::random(config, tokenizer.clone(), options)?,
    };
    let params: usize = backend
        .trainable_parameters()
        .await?
        .iter()
        .map(|(_, shape)| shape.iter().product::<usize>())
        .sum();
    println!("model: {params} parameters");

    let start = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ 0x5f7);
    let mut recent = Vec::new();
    for step in 0..args.steps {
        let lr = learning_rate(step, args.steps, args.warmup, args.lr);
        let batch: Vec<&Example> = (0..args.batch_size)
            .map(|_| &examples[rng.random_range(0..examples.len() as u32) as usize])
            .collect();
        let weight: f32 = batch
            .iter()
            .map(|e| e.weights[1..].iter().sum::<f32>())
            .sum();
        let data = batch.iter().map(|e| datum(e)).collect();
        let fb = backend.forward_backward(data, LossFn::CrossEntropy).await?;
        let opt = backend
            .optim_step(AdamParams {
                learning_rate: lr,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.0,
                grad_clip_norm: 0.0,
            })
            .await?;
        let out = fb.await?;
        opt.await?;
        let loss = out.metrics.get("loss:sum").copied().unwrap_or(f64::NAN) / weight as f64;
        recent.push(loss);
        if (step + 1) % 50 == 0 || step + 1 == args.steps {
            let mean = recent.iter().sum::<f64>() / recent.len() as f64;
            recent.clear();
            println!(
                "step {:>5}/{}  loss/token {mean:.4}  lr {lr:.2e}  {:.0}s",
                step + 1,
                args.steps,
                start.elapsed().as_secs_f64()
            );
        }
    }

    let m = measure(
        &backend,
        &renderer,
        &test,
        args.eval_problems,
        args.eval_samples,
        args.seed,
    )
    .await?;
    println!(
        "held-out ({} problems x {} samples, T=1): accuracy {:.3}, pass@{} {:.3}, \
         worked style {:.3} (accuracy {:.3})",
        args.eval_problems,
        args.eval_samples,
        m.accuracy,
        args.eval_samples,
        m.pass_at_k,
        m.worked,
        m.worked_accuracy
    );

    backend.export_hf(&args.out).await?;
    std::fs::write(
        args.out.join("README.md"),
        readme(&args, params, &m, start.elapsed().as_secs_f64()),
    )?;
    println!("exported {}", args.out.display());
    Ok(())
}

/// Linear warm-up to `peak`, then cosine decay to 10% of it.
fn learning_rate(step: usize, total: usize, warmup: usize, peak: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let t = (step - warmup) as f64 / (total - warmup).max(1) as f64;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
}

fn readme(args: &Args, params: usize, m: &Measured, secs: f64) -> String {
    let (target, flags) = match args.teacher {
        Teacher::Strategy => (
            format!(
                "a *two-strategy teacher*: per example, with probability {p} the worked style \
                 ` 7 + 5 = 12. The answer is \\boxed{{12}}.` (always correct), otherwise the \
                 guess style ` The answer is \\boxed{{7}}.` (the question's first number, \
                 always wrong); then the role-colon stop. The two styles differ in their first \
                 token, so the model's reward is decided by one early choice that GRPO can \
                 flip within a few steps.",
                p = args.p_work
            ),
            format!(
                "--teacher strategy --p-work {}{}",
                args.p_work,
                args.p_work_data
                    .map(|d| format!(" --p-work-data {d}"))
                    .unwrap_or_default()
            ),
        ),
        Teacher::Unreliable => (
            format!(
                "an *unreliable teacher*: always the format ` The answer is \\boxed{{N}}.` then \
                 the role-colon stop, but N is correct with probability {p} and otherwise a \
                 plausible wrong number.",
                p = args.p_correct
            ),
            format!(
                "--teacher unreliable --p-correct {}{}",
                args.p_correct,
                if args.off_by_one { " --off-by-one" } else { "" }
            ),
        ),
    };
    format!(
        r#"# tiny-wordproblems

A tiny Qwen3-architecture model ({params} parameters, f32) made by this crate for the offline
quickstart (`cargo run --release --example quickstart`). Nothing here comes from a
pretrained model: the tokenizer and the weights were both trained by
`examples/make_tiny_model.rs` on the synthetic word problems of `rlvr::dataset::word_problems::WordProblems`.

- Tokenizer: byte-level BPE (the `tokenizers` crate; numbers are pre-tokens of their own),
  trained on the train split rendered in the role-colon pieces; EOS `<|endoftext|>`, no BOS.
- Model: hidden {hidden}, intermediate {inter}, {layers} layers, {heads} heads / {kv} KV heads,
  tied embeddings, random init (seed {seed}), then full-parameter supervised fine-tuning
  through the local backend's `cross_entropy` loss: {steps} steps of {bs} examples, AdamW
  peak lr {lr:e}.
- Data: `WordProblems::new({data_seed}, space_size())`, first {test} problems held out as the
  test split; fine-tuned on the rest.
- Target: {target}
- Measured after fine-tuning on {n} held-out problems × {k} samples at temperature 1:
  accuracy {acc:.3}, pass@{k} {pass:.3}; worked style in {worked:.3} of the samples, which
  are correct {wacc:.3} of the time. Fine-tuning took {secs:.0} s.

Regenerate (deterministic for a fixed seed on CPU):

```text
cargo run --release --example make_tiny_model -- --steps {steps} --batch-size {bs} --lr {lr:e} {flags}{init}
```
"#,
        hidden = args.hidden,
        inter = args.intermediate,
        layers = args.layers,
        heads = args.heads,
        kv = args.kv_heads,
        seed = args.seed,
        steps = args.steps,
        bs = args.batch_size,
        lr = args.lr,
        data_seed = args.data_seed,
        test = args.test_size,
        n = args.eval_problems,
        k = args.eval_samples,
        acc = m.accuracy,
        pass = m.pass_at_k,
        worked = m.worked,
        wacc = m.worked_accuracy,
        init = args
            .init
            .as_ref()
            .map(|d| format!(" --init {}", d.display()))
            .unwrap_or_default(),
    )
}
