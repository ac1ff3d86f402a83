//! Regenerates the embedded tiny models: `examples/tiny-wordproblems` (`--task
//! word-problems`, the default) and `examples/tiny-arithmetic` (`--task arithmetic`).
//!
//! 1. Trains a small byte-level BPE tokenizer (the `tokenizers` crate; numbers, or for
//!    arithmetic their digits, split off as their own pre-tokens) on the task's problems in
//!    the role-colon pieces.
//! 2. Builds a tiny Qwen3-architecture configuration over that vocabulary, initialises it at
//!    random with the local backend, and fine-tunes every parameter through the backend's own
//!    `cross_entropy` path on the task's train split.
//! 3. Exports config.json, model.safetensors, tokenizer.json, tokenizer_config.json and a
//!    README with the provenance.
//!
//! The tasks:
//!
//! - `word-problems`: the synthetic word problems of `WordProblems`, used by the quickstart.
//! - `arithmetic`: the cookbook's arithmetic environment, `What is x + y?` (x, y in
//!   `0..=--max-operand`) after its few-shot prefix (user `What is 4 + 5?`, assistant `9`),
//!   graded by the last integer of the response; for `--example math -- --dataset arithmetic`.
//!
//! The supervised target is by default a *two-strategy teacher*: per example, with
//! probability `--p-work` a worked completion that ends with the correct answer, otherwise a
//! short guess that ends with a wrong one. The two styles part at one token, so after
//! fine-tuning the model's reward is decided by one early choice: exactly the situation in
//! which GRPO visibly learns within a few dozen steps. (`--teacher unreliable`, word problems
//! only: always the answer format, the number correct with probability `--p-correct`.)
//!
//! ```text
//! cargo run --release --example make_tiny_model
//! cargo run --release --example make_tiny_model -- --task arithmetic
//! ```
//!
//! The READMEs in the model directories give the exact commands that made them.

use std::collections::HashSet;
use std::path::PathBuf;

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rlvr::backend::local::{LocalBackend, LocalOptions, Qwen3Config};
use rlvr::dataset::word_problems::{Arithmetic, MAX_OPERAND, answer_text};
use rlvr::dataset::{Problem, shuffled_indices};
use rlvr::message::Message;
use rlvr::renderer::{ParseTermination, TrainOnWhat};
use rlvr::reward::extract_boxed;
use rlvr::{Dataset, dataset::word_problems::WordProblems};
use rlvr::{
    PolicyBackend, Sampler,
    types::{AdamParams, Datum, LossFn, ModelInput, SamplingParams, TensorData},
};
use rlvr::{Renderer, RoleColon};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, TokenizerBuilder};

/// The end-of-text special token of the tiny tokenizer.
const EOS: &str = "<|endoftext|>";

/// Which model to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Task {
    /// The quickstart's synthetic word problems (`examples/tiny-wordproblems`).
    WordProblems,
    /// The cookbook's arithmetic environment: `What is x + y?` after the few-shot prefix
    /// (`examples/tiny-arithmetic`).
    Arithmetic,
}

impl Task {
    /// The default output directory.
    fn default_out(self) -> PathBuf {
        let name = match self {
            Task::WordProblems => "tiny-wordproblems",
            Task::Arithmetic => "tiny-arithmetic",
        };
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name)
    }
}

/// How the tokenizer cuts numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Numbers {
    /// Each number is a pre-token of its own (frequent numbers become single tokens).
    Whole,
    /// Each digit is a token of its own.
    Digits,
}

impl Args {
    /// How the tokenizer cuts numbers: `--numbers`, else the task's default.
    fn numbers(&self) -> Numbers {
        self.numbers.unwrap_or(match self.task {
            Task::WordProblems => Numbers::Whole,
            Task::Arithmetic => Numbers::Digits,
        })
    }
}

/// How the teacher writes its completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Teacher {
    /// Per example, either the worked style (probability `--p-work`, always correct) or the
    /// guess style (the first number of the question). Word problems: ` 7 + 5 = 12. The
    /// answer is \boxed{12}.` or ` The answer is \boxed{7}.` (always wrong); arithmetic:
    /// ` 37 + 52 = 89` or ` 37` (wrong unless the second number is 0).
    Strategy,
    /// Always ` The answer is \boxed{N}.`, N correct with probability `--p-correct` (word
    /// problems only).
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
#[command(about = "Regenerate the embedded tiny models (word problems, arithmetic)")]
struct Args {
    /// The task: `word-problems` (the quickstart's model) or `arithmetic` (the cookbook's
    /// arithmetic environment).
    #[arg(long, value_enum, default_value_t = Task::WordProblems)]
    task: Task,
    /// Output directory (default: `examples/tiny-wordproblems` or `examples/tiny-arithmetic`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Largest operand of the arithmetic problems (`--task arithmetic`; operands run over
    /// `0..=max_operand`, the cookbook's range is 0..=100).
    #[arg(long, default_value_t = 100)]
    max_operand: u32,
    /// How the tokenizer cuts numbers: `whole` (each number a pre-token of its own, the
    /// word-problem default) or `digits` (one token per digit, the arithmetic default).
    #[arg(long, value_enum)]
    numbers: Option<Numbers>,
    /// Seed of the problem set or, for arithmetic, of the order of the pairs (the examples
    /// use the same seed and split).
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
    /// Also measure on the held-out problems every this many steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    eval_every: usize,
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

/// The user message of the cookbook's arithmetic few-shot prefix and its answer.
const FEWSHOT: (&str, &str) = ("What is 4 + 5?", "9");

/// The arithmetic question, as the cookbook's `ArithmeticEnv` asks it.
fn arithmetic_question(x: u32, y: u32) -> String {
    format!("What is {x} + {y}?")
}

/// One problem of the task: the prompt, the reference answer and the teacher's two styles.
struct Item {
    /// The prompt (few-shot prefix included) and the reference answer.
    problem: Problem,
    /// The worked completion, ending with the correct answer.
    worked: String,
    /// The guess completion, ending with the question's first number.
    guess: String,
    /// The numbers behind a word problem (for the unreliable teacher); `None` for arithmetic.
    arithmetic: Option<Arithmetic>,
}

/// The items of a word-problem split, in order.
fn word_problem_items(set: &WordProblems) -> Result<Vec<Item>> {
    (0..set.len())
        .map(|i| {
            let a = set.arithmetic(i).context("arithmetic of a word problem")?;
            Ok(Item {
                problem: set.get(i)?,
                worked: worked_text(&a),
                guess: guess_text(&a),
                arithmetic: Some(a),
            })
        })
        .collect()
}

/// The `(train, test)` items of the arithmetic task: every pair `x, y` in
/// `0..=max_operand`, in the order `shuffled_indices(pairs, data_seed)`, the first
/// `test_size` held out.
fn arithmetic_items(
    max_operand: u32,
    data_seed: u64,
    test_size: usize,
) -> Result<(Vec<Item>, Vec<Item>)> {
    let side = max_operand as usize + 1;
    let pairs = side * side;
    if test_size >= pairs {
        anyhow::bail!("--test-size {test_size} leaves no train problems of {pairs} pairs");
    }
    let mut items: Vec<Item> = shuffled_indices(pairs, data_seed)
        .into_iter()
        .map(|i| {
            let (x, y) = ((i / side) as u32, (i % side) as u32);
            let question = arithmetic_question(x, y);
            let mut problem = Problem::new(
                format!("arithmetic/{x}+{y}"),
                question.clone(),
                (x + y).to_string(),
            );
            problem.messages = vec![
                Message::user(FEWSHOT.0),
                Message::assistant(FEWSHOT.1),
                Message::user(question),
            ];
            Item {
                problem,
                worked: format!("{x} + {y} = {}", x + y),
                guess: x.to_string(),
                arithmetic: None,
            }
        })
        .collect();
    let train = items.split_off(test_size);
    Ok((train, items))
}

/// The tokenizer corpus of the word problems: the train split in the pieces the role-colon
/// renderer tokenizes separately (`User:`, ` question\n\n`, `Assistant:`, ` answer\n\n`).
fn word_problem_corpus(train: &WordProblems) -> Result<Vec<String>> {
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
    Ok(corpus)
}

/// The tokenizer corpus of the arithmetic task: the train split in the role-colon pieces,
/// both styles of completion, and every number up to `2 * max_operand` standing alone.
fn arithmetic_corpus(train: &[Item], max_operand: u32) -> Vec<String> {
    let mut corpus = Vec::with_capacity(6 * train.len());
    for item in train {
        corpus.push("User:".to_string());
        corpus.push(format!(" {}\n\n", FEWSHOT.0));
        corpus.push("Assistant:".to_string());
        corpus.push(format!(" {}\n\n", FEWSHOT.1));
        corpus.push("User:".to_string());
        corpus.push(format!(" {}\n\n", item.problem.question));
        corpus.push("Assistant:".to_string());
        corpus.push(format!(" {}\n\n", item.worked));
        corpus.push(format!(" {}\n\n", item.guess));
    }
    for n in 0..=2 * max_operand {
        for _ in 0..2 {
            corpus.push(format!(" {n}\n\n"));
        }
    }
    corpus
}

/// Trains the byte-level BPE tokenizer on `corpus` (pieces that the role-colon renderer
/// tokenizes separately) and writes tokenizer.json and tokenizer_config.json to `out`.
fn train_tokenizer(
    corpus: &[String],
    vocab_size: usize,
    numbers: Numbers,
    out: &std::path::Path,
) -> Result<rlvr::tokenizer::Tokenizer> {
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
            // Numbers (or digits) stand alone, without the space before them: `3` is the same
            // token in the question and in the answer, which makes the arithmetic easier to
            // learn.
            Split::new(
                SplitPattern::Regex(
                    match numbers {
                        Numbers::Whole => "[0-9]+",
                        Numbers::Digits => "[0-9]",
                    }
                    .into(),
                ),
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

/// Fails unless every number in `0..=max` is a single token of `tokenizer`.
fn check_number_tokens(tokenizer: &rlvr::tokenizer::Tokenizer, max: u32) -> Result<()> {
    for n in 0..=max {
        let tokens = tokenizer.encode(&n.to_string())?;
        if tokens.len() != 1 {
            anyhow::bail!(
                "{n} is {} tokens, not one: raise --vocab-size",
                tokens.len()
            );
        }
    }
    Ok(())
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

/// The supervised example of `item` answered with `text`.
fn render(renderer: &RoleColon, item: &Item, text: String) -> Result<(Vec<u32>, Vec<f32>)> {
    let mut messages = item.problem.messages.clone();
    messages.push(Message::assistant(text));
    let (input, weights) =
        renderer.supervised_example(&messages, TrainOnWhat::LastAssistantMessage)?;
    Ok((input.to_tokens(), weights))
}

fn sft_examples(train: &[Item], renderer: &RoleColon, args: &Args) -> Result<Vec<Example>> {
    let seed = args.seed;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(train.len());
    for item in train {
        let p_data = args.p_work_data.unwrap_or(args.p_work);
        // Share of the worked examples whose style token is supervised, so that the
        // supervised style tokens are worked with probability `p_work`.
        let keep = if p_data > 0.0 && p_data < 1.0 {
            (args.p_work * (1.0 - p_data) / (p_data * (1.0 - args.p_work))).min(1.0)
        } else {
            1.0
        };
        let (text, mask_choice) = match args.teacher {
            Teacher::Strategy => {
                if rng.random_bool(p_data) {
                    (item.worked.clone(), !rng.random_bool(keep))
                } else {
                    (item.guess.clone(), false)
                }
            }
            Teacher::Unreliable => {
                let a = item
                    .arithmetic
                    .as_ref()
                    .context("--teacher unreliable needs --task word-problems")?;
                (
                    answer_text(teacher_answer(a, args.p_correct, args.off_by_one, &mut rng)),
                    false,
                )
            }
        };
        let (tokens, mut weights) = render(renderer, item, text)?;
        if mask_choice {
            // The style token: the first token where the worked and the guess completions
            // part (the first completion token for word problems, the one after the first
            // number for arithmetic).
            let (guess, _) = render(renderer, item, item.guess.clone())?;
            let choice = tokens
                .iter()
                .zip(&guess)
                .position(|(a, b)| a != b)
                .unwrap_or(guess.len().min(tokens.len()));
            if let Some(w) = weights.get_mut(choice) {
                *w = 0.0;
            }
        }
        out.push(Example {
            tokens,
            weights,
            answer: item.problem.answer.clone(),
        });
    }
    Ok(out)
}

/// The last integer of `text` with commas removed (the cookbook's arithmetic grader).
fn last_integer(text: &str) -> Option<i64> {
    static INTEGER: std::sync::LazyLock<regex::Regex> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"-?[0-9]+").expect("a valid pattern"));
    let text = text.replace(',', "");
    INTEGER.find_iter(&text).last()?.as_str().parse().ok()
}

/// Whether the response `text` answers `problem` correctly, by the task's grader.
fn is_correct(task: Task, problem: &Problem, text: &str) -> bool {
    match task {
        Task::WordProblems => extract_boxed(text).as_deref() == Some(problem.answer.as_str()),
        Task::Arithmetic => {
            last_integer(text).is_some_and(|n| Some(n) == problem.answer.parse().ok())
        }
    }
}

/// Whether the response `text` is in the worked style.
fn is_worked(task: Task, text: &str) -> bool {
    match task {
        // The guess style starts with "The answer".
        Task::WordProblems => text.trim_start().starts_with(|c: char| c.is_ascii_digit()),
        // The guess style is a bare number.
        Task::Arithmetic => text.contains('='),
    }
}

/// What [`measure`] found.
struct Measured {
    /// Fraction of correct samples.
    accuracy: f64,
    /// Fraction of problems with at least one correct sample.
    pass_at_k: f64,
    /// Fraction of samples in the worked style.
    worked: f64,
    /// Accuracy of the worked-style samples.
    worked_accuracy: f64,
    /// Fraction of samples that ended with the renderer's stop sequence.
    stopped: f64,
}

/// Accuracy at temperature 1, pass@k and the worked-style statistics of the backend's
/// current weights on `problems`.
async fn measure(
    backend: &LocalBackend,
    renderer: &RoleColon,
    task: Task,
    problems: &[Item],
    k: usize,
    seed: u64,
) -> Result<Measured> {
    let sampler = backend.sampler().await?;
    let params = SamplingParams::default()
        .max_tokens(32)
        .temperature(1.0)
        .stop(renderer.stop());
    // Every problem gets a seed of its own: under one seed, every prompt would draw the same
    // random numbers, and the style choice (made at the same position in every prompt) would
    // come out the same for all of them.
    let mut seeds = ChaCha8Rng::seed_from_u64(seed);
    let (mut correct, mut solved, mut total) = (0usize, 0usize, 0usize);
    let (mut worked, mut worked_correct, mut stopped) = (0usize, 0usize, 0usize);
    for item in problems {
        let p = &item.problem;
        let prompt = renderer.generation_prompt(&p.messages)?;
        let params = params.clone().seed(seeds.random());
        let samples = sampler.sample(&prompt, k, &params).await?;
        let mut any = false;
        for s in &samples {
            let (message, termination) = renderer.parse_response(&s.tokens);
            let text = message.text();
            let ok = is_correct(task, p, &text);
            correct += ok as usize;
            any |= ok;
            if is_worked(task, &text) {
                worked += 1;
                worked_correct += ok as usize;
            }
            stopped += (termination == ParseTermination::StopSequence) as usize;
            total += 1;
        }
        solved += any as usize;
    }
    Ok(Measured {
        accuracy: correct as f64 / total.max(1) as f64,
        pass_at_k: solved as f64 / problems.len().max(1) as f64,
        worked: worked as f64 / total.max(1) as f64,
        worked_accuracy: worked_correct as f64 / worked.max(1) as f64,
        stopped: stopped as f64 / total.max(1) as f64,
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
    let out = args.out.clone().unwrap_or_else(|| args.task.default_out());
    // The tokenizer goes to a scratch directory; `export_hf` writes the final directory in one
    // rename, so a failed run leaves the committed model untouched.
    let scratch = tempfile::tempdir()?;
    let (train, test, corpus) = match args.task {
        Task::WordProblems => {
            let all = WordProblems::new(args.data_seed, WordProblems::space_size())?;
            let (train, test) = all.split(args.test_size)?;
            let corpus = word_problem_corpus(&train)?;
            (
                word_problem_items(&train)?,
                word_problem_items(&test)?,
                corpus,
            )
        }
        Task::Arithmetic => {
            let (train, test) = arithmetic_items(args.max_operand, args.data_seed, args.test_size)?;
            let corpus = arithmetic_corpus(&train, args.max_operand);
            (train, test, corpus)
        }
    };
    let tokenizer = match &args.init {
        Some(dir) => rlvr::tokenizer::Tokenizer::from_file(dir.join("tokenizer.json"))?,
        None => train_tokenizer(&corpus, args.vocab_size, args.numbers(), scratch.path())?,
    };
    println!(
        "tokenizer: {} tokens, eos {:?}",
        tokenizer.vocab_size(),
        tokenizer.eos_token_id()
    );
    if args.task == Task::Arithmetic && args.numbers() == Numbers::Whole {
        check_number_tokens(&tokenizer, 2 * args.max_operand)?;
    }
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
        for item in &test {
            let p = &item.problem;
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

    let eval_set = &test[..args.eval_problems.min(test.len())];
    let report = |m: &Measured| {
        println!(
            "held-out ({} problems x {} samples, T=1): accuracy {:.3}, pass@{} {:.3}, \
             worked style {:.3} (accuracy {:.3}), stop sequence {:.3}",
            eval_set.len(),
            args.eval_samples,
            m.accuracy,
            args.eval_samples,
            m.pass_at_k,
            m.worked,
            m.worked_accuracy,
            m.stopped
        )
    };
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
        if args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 < args.steps {
            let m = measure(
                &backend,
                &renderer,
                args.task,
                eval_set,
                args.eval_samples,
                args.seed,
            )
            .await?;
            report(&m);
        }
    }
    let secs = start.elapsed().as_secs_f64();

    let m = measure(
        &backend,
        &renderer,
        args.task,
        eval_set,
        args.eval_samples,
        args.seed,
    )
    .await?;
    report(&m);

    backend.export_hf(&out).await?;
    let readme = match args.task {
        Task::WordProblems => readme(&args, params, &m, secs),
        Task::Arithmetic => arithmetic_readme(&args, &tokenizer, params, &m, secs),
    };
    std::fs::write(out.join("README.md"), readme)?;
    println!("exported {}", out.display());
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

/// The command line that makes the arithmetic model with `args` (every setting spelled out).
fn arithmetic_command(args: &Args) -> String {
    let numbers = match args.numbers() {
        Numbers::Whole => "whole",
        Numbers::Digits => "digits",
    };
    let mut cmd = format!(
        "cargo run --release --example make_tiny_model -- --task arithmetic --max-operand {} \\\n    \
         --test-size {} --data-seed {} --seed {}",
        args.max_operand, args.test_size, args.data_seed, args.seed
    );
    match &args.init {
        Some(dir) => cmd += &format!(" --init {}", dir.display()),
        None => {
            cmd += &format!(
                " --numbers {numbers} --vocab-size {} \\\n    --hidden {} --intermediate {} \
                 --layers {} --heads {} --kv-heads {}",
                args.vocab_size,
                args.hidden,
                args.intermediate,
                args.layers,
                args.heads,
                args.kv_heads
            )
        }
    }
    cmd += &format!(
        " \\\n    --steps {} --batch-size {} --lr {:e} --warmup {} --p-work {}",
        args.steps, args.batch_size, args.lr, args.warmup, args.p_work
    );
    if let Some(d) = args.p_work_data {
        cmd += &format!(" --p-work-data {d}");
    }
    cmd += &format!(
        " \\\n    --eval-problems {} --eval-samples {}",
        args.eval_problems, args.eval_samples
    );
    if let Some(out) = &args.out {
        cmd += &format!(" --out {}", out.display());
    }
    cmd
}

fn arithmetic_readme(
    args: &Args,
    tokenizer: &rlvr::tokenizer::Tokenizer,
    params: usize,
    m: &Measured,
    secs: f64,
) -> String {
    let max = args.max_operand;
    let side = max as usize + 1;
    let p_data = args.p_work_data.unwrap_or(args.p_work);
    let data_note = if p_data > args.p_work {
        format!(
            "\n  The fine-tuning data has the worked style in {p_data} of its examples, so that \
             the model\n  sees plenty of sums, but the style token of the extra worked \
             examples has weight 0: the\n  supervised style tokens are worked with \
             probability {p}.",
            p = args.p_work
        )
    } else {
        String::new()
    };
    let numbers = match args.numbers() {
        Numbers::Whole => format!(
            "numbers are pre-tokens of their own, every number 0..={} one token",
            2 * max
        ),
        Numbers::Digits => "every digit is a token of its own".to_string(),
    };
    let init = match &args.init {
        Some(dir) => format!("warm-started from `{}`", dir.display()),
        None => format!("random init (seed {})", args.seed),
    };
    format!(
        r#"# tiny-arithmetic

A tiny Qwen3-architecture model ({params} parameters, f32) made by this crate for the
cookbook's arithmetic environment, offline (`cargo run --release --example math -- --dataset arithmetic`).
Nothing here comes from a pretrained model: the tokenizer and the weights were both trained by
`examples/make_tiny_model.rs --task arithmetic`.

## What it is

- The task: the cookbook's `ArithmeticEnv`, `What is x + y?` with x, y in 0..={max}, asked
  after its few-shot prefix (user `What is 4 + 5?`, assistant `9`), rendered with the
  role-colon renderer (`rlvr::RoleColon`). The cookbook grades the last integer of the
  response (commas removed); its reward is `0.1 * (well_formed - 1) + correct`, well formed
  meaning ended by the stop sequence `\n\nUser:`.
- Tokenizer: byte-level BPE (the `tokenizers` crate), {vocab} tokens, trained on the train
  split rendered in the role-colon pieces; {numbers}. EOS `<|endoftext|>`, no BOS.
- Model: hidden {hidden}, intermediate {inter}, {layers} layers, {heads} heads / {kv} KV
  heads, tied embeddings, {init}, then full-parameter supervised fine-tuning through the
  local backend's own `cross_entropy` loss: {steps} steps of {bs} examples, AdamW peak lr {lr:e}
  (linear warm-up over {warmup} steps, cosine decay to a tenth).
- Data: all {pairs} pairs (x, y), ordered by
  `rlvr::dataset::shuffled_indices({pairs}, {data_seed})` (pair index i is x = i / {side},
  y = i % {side}); the first {test} pairs are held out, the model is fine-tuned on the other
  {train}.
- Target: a *two-strategy teacher*. Per example, with probability {p} the worked style
  ` 37 + 52 = 89` (always correct), otherwise the guess style ` 37` (the first number, wrong
  unless the second is 0); then the role-colon stop.{data_note}
- Measured after fine-tuning ({n} held-out pairs × {k} samples, temperature 1): accuracy
  {acc:.3}, pass@{k} {pass:.3}; the worked style in {worked:.3} of the samples, correct
  {wacc:.3} of the time; {stopped:.3} of the samples end with the stop sequence.

## Why this teacher

The offline example has to show GRPO learning within minutes on a few CPU cores. The two
styles share their first tokens (the space and the first number) and part at the next one
(` +` or the stop), so a completion's reward is decided by one early choice, which GRPO flips
within a few dozen steps; the sums themselves are learnt during fine-tuning. A model that
always answered right would leave GRPO nothing to learn; one that answered at random would
give it no signal (groups whose samples all score the same).

Numbers are cut into digits because a sum is then a short rule over digit tokens (with a
carry) that a model this small learns in minutes: with every number one token
(`--numbers whole`), the same fine-tuning reached only 0.13 accuracy in the worked style, as
it has to learn a {side}×{side} table of tokens.

## Regenerate

Deterministic for a fixed seed on the CPU (fine-tuning took {secs:.0} s on a loaded 2-core
machine):

```text
{command}
```

The command writes this directory, this README included.
"#,
        params = thousands(params),
        vocab = tokenizer.vocab_size(),
        hidden = args.hidden,
        inter = args.intermediate,
        layers = args.layers,
        heads = args.heads,
        kv = args.kv_heads,
        steps = args.steps,
        bs = args.batch_size,
        lr = args.lr,
        warmup = args.warmup,
        pairs = side * side,
        data_seed = args.data_seed,
        test = args.test_size,
        train = side * side - args.test_size,
        p = args.p_work,
        n = args.eval_problems,
        k = args.eval_samples,
        acc = m.accuracy,
        pass = m.pass_at_k,
        worked = m.worked,
        wacc = m.worked_accuracy,
        stopped = m.stopped,
        command = arithmetic_command(args),
    )
}

/// `n` with a comma between groups of three digits (`626,560`).
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
