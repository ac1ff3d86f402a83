//! Property tests (proptest) for the functions that read user and server input: the boxed
//! grader, renderer response parsing, GSM8K answer parsing, the run-directory readers used
//! on resume, and the Tinker little-endian decoders (the protobuf decoders are crate-private
//! and have their own property tests in `src/backend/tinker`).
//!
//! Each property's first promise is "never panics"; where a precise answer is known it is
//! checked too. The case counts are modest so the file runs in a few seconds in debug.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use crate::common::renderer_fixtures::family_tokenizer;
use proptest::prelude::*;
use rlvr::report::RunDir;
use rlvr::reward::{answers_equivalent, extract_boxed};
use rlvr::types::{StopCondition, TokenId};
use rlvr::{Dataset, Gsm8k, dataset::extract_gsm8k_final_answer};
use rlvr::{Renderer, renderer};

/// The case count: `default`, or `PROPTEST_CASES` for a longer search.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text made mostly of the characters the parsers care about.
fn latexish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just(r"\boxed".to_string()),
        Just(r"\boxed{".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("\\".to_string()),
        Just(r"\frac".to_string()),
        Just(r"\sqrt".to_string()),
        Just(r"\text{".to_string()),
        Just(r"\$".to_string()),
        Just(r"\%".to_string()),
        Just(r"\,".to_string()),
        Just(r"\!".to_string()),
        Just("^".to_string()),
        Just(",".to_string()),
        Just(".".to_string()),
        Just("/".to_string()),
        Just("-".to_string()),
        Just(" ".to_string()),
        Just("####".to_string()),
        Just("\n".to_string()),
        Just("\r".to_string()),
        Just("\u{2028}".to_string()),
        Just("é".to_string()),
        Just("😀".to_string()),
        "[0-9]{1,40}",
        "[a-z]{1,6}",
        any::<String>().prop_map(|s| s.chars().take(4).collect()),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

/// Brace-balanced text without a stray `}` (so it can sit inside `\boxed{…}`).
fn balanced() -> impl Strategy<Value = String> {
    let leaf = "[^{}]{0,8}".prop_map(|s| s);
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 1..4).prop_map(|v| v.concat()),
            inner.prop_map(|s| format!("{{{s}}}")),
        ]
    })
}

// ---------------------------------------------------------------------------------------------
// The boxed grader
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn extract_boxed_never_panics(text in latexish()) {
        let _ = extract_boxed(&text);
    }

    #[test]
    fn extract_boxed_never_panics_on_any_string(text in any::<String>()) {
        let _ = extract_boxed(&text);
    }

    #[test]
    fn extract_boxed_returns_a_balanced_box(prefix in "[^{}\\\\]{0,12}", x in balanced(), suffix in "[^{}\\\\]{0,12}") {
        let text = format!("{prefix}\\boxed{{{x}}}{suffix}");
        // The last box to close is the outer one: its whole content comes back.
        prop_assert_eq!(extract_boxed(&text), Some(x));
    }

    #[test]
    fn answers_equivalent_never_panics(a in latexish(), b in latexish()) {
        let _ = answers_equivalent(&a, &b);
        let _ = answers_equivalent(&b, &a);
    }

    #[test]
    fn answers_equivalent_never_panics_on_any_string(a in any::<String>(), b in any::<String>()) {
        let _ = answers_equivalent(&a, &b);
    }

    #[test]
    fn answers_equivalent_is_reflexive_on_integers(n in any::<i64>()) {
        let s = n.to_string();
        prop_assert!(answers_equivalent(&s, &s), "{s}");
        // Also with thousands separators and a trailing `.0`: the same number.
        prop_assert!(answers_equivalent(&format!("{s}.0"), &s), "{s}.0");
    }

    #[test]
    fn answers_equivalent_is_reflexive_on_big_integers(digits in "-?[1-9][0-9]{0,60}") {
        prop_assert!(answers_equivalent(&digits, &digits), "{digits}");
    }

    #[test]
    fn answers_equivalent_is_symmetric_on_numbers(a in number(), b in number()) {
        prop_assert_eq!(answers_equivalent(&a, &b), answers_equivalent(&b, &a), "{} vs {}", a, b);
    }

    #[test]
    fn boxed_integer_round_trips(n in any::<i64>(), pre in "[a-z ]{0,10}") {
        let text = format!("{pre} so the answer is \\boxed{{{n}}}.");
        let got = extract_boxed(&text).expect("a box");
        prop_assert!(answers_equivalent(&got, &n.to_string()));
    }
}

/// Numbers as models write them: integers, decimals, fractions, with `$`, `%`, separators.
fn number() -> impl Strategy<Value = String> {
    let int = "-?[0-9]{1,7}";
    prop_oneof![
        int.prop_map(|s| s),
        (int, "[0-9]{1,4}").prop_map(|(a, b)| format!("{a}.{b}")),
        (int, "[1-9][0-9]{0,3}").prop_map(|(a, b)| format!("{a}/{b}")),
        (int, "[1-9][0-9]{0,3}").prop_map(|(a, b)| format!(r"\frac{{{a}}}{{{b}}}")),
        "[1-9][0-9]{0,2}(,[0-9]{3}){0,3}".prop_map(|s| s),
        int.prop_map(|s| format!(r"\${s}")),
        int.prop_map(|s| format!(r"{s}\%")),
        int.prop_map(|s| format!(r"\text{{{s}}}")),
        (int, "[1-9]").prop_map(|(a, b)| format!(r"{a}\sqrt{{{b}}}")),
    ]
}

// ---------------------------------------------------------------------------------------------
// Renderer response parsing
// ---------------------------------------------------------------------------------------------

/// (renderer name, tokenizer family) pairs covering each parser.
const RENDERERS: &[(&str, &str)] = &[
    ("qwen3", "qwen3"),
    ("qwen3_disable_thinking", "qwen3"),
    ("llama3", "llama3"),
    ("kimi_k2", "kimi"),
    ("gpt_oss_no_sysprompt", "gpt_oss"),
    ("deepseekv3_thinking", "deepseek"),
    ("glm5_3_max_reasoning", "glm5_3"),
    ("role_colon", "role_colon"),
];

struct Subject {
    name: &'static str,
    renderer: Arc<dyn Renderer>,
    /// Ids the parsers branch on: stop tokens, added (special) tokens, and the pieces of
    /// think / tool-call markup.
    interesting: Vec<TokenId>,
    vocab: u32,
    tokenizer: rlvr::tokenizer::Tokenizer,
}

fn subjects() -> &'static [Subject] {
    static SUBJECTS: OnceLock<Vec<Subject>> = OnceLock::new();
    SUBJECTS.get_or_init(|| {
        RENDERERS
            .iter()
            .map(|&(name, family)| {
                let tokenizer = family_tokenizer(family);
                let renderer = renderer::by_name(name, tokenizer.clone()).expect("built-in");
                let mut interesting: Vec<TokenId> = tokenizer
                    .inner()
                    .get_added_tokens_decoder()
                    .keys()
                    .copied()
                    .collect();
                if let StopCondition::Tokens(t) = renderer.stop() {
                    interesting.extend(t);
                }
                for text in [
                    "<think>",
                    "</think>",
                    "<tool_call>",
                    "</tool_call>",
                    "{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
                    "{",
                    "}",
                    "\n",
                    "User:",
                    "Assistant:",
                    "analysis",
                    "final",
                    "commentary",
                    "to=functions.f",
                    "json",
                ] {
                    interesting.extend(tokenizer.encode(text).unwrap_or_default());
                }
                interesting.sort_unstable();
                interesting.dedup();
                let vocab = tokenizer.vocab_size() as u32;
                Subject {
                    name,
                    renderer,
                    interesting,
                    vocab,
                    tokenizer,
                }
            })
            .collect()
    })
}

fn token_ids(subject: &'static Subject) -> impl Strategy<Value = Vec<TokenId>> {
    let id = prop_oneof![
        6 => prop::sample::select(subject.interesting.clone()),
        3 => 0..subject.vocab,
        1 => subject.vocab..subject.vocab.saturating_add(64),
        1 => any::<u32>(),
    ];
    prop::collection::vec(id, 0..40)
}

fn check_parse(subject: &Subject, tokens: &[TokenId]) {
    let _ = subject.renderer.parse_response(tokens);
    let _ = subject.renderer.try_parse_response(tokens);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn parse_response_never_panics_on_token_ids(which in 0..RENDERERS.len(), seed in any::<u64>()) {
        let subject = &subjects()[which];
        // A nested runner: the strategy depends on the renderer's vocabulary.
        let mut runner = proptest::test_runner::TestRunner::new_with_rng(
            ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() },
            proptest::test_runner::TestRng::from_seed(
                proptest::test_runner::RngAlgorithm::ChaCha,
                &{
                    let mut s = [0u8; 32];
                    s[..8].copy_from_slice(&seed.to_le_bytes());
                    s
                },
            ),
        );
        let result = runner.run(&token_ids(subject), |tokens| {
            check_parse(subject, &tokens);
            Ok(())
        });
        prop_assert!(result.is_ok(), "{}: {:?}", subject.name, result);
    }

    #[test]
    fn parse_response_never_panics_on_encoded_markup(which in 0..RENDERERS.len(), text in markup(), stop in any::<bool>()) {
        let subject = &subjects()[which];
        let mut tokens = subject.tokenizer.encode(&text).unwrap_or_default();
        if stop
            && let StopCondition::Tokens(t) = subject.renderer.stop() {
                tokens.extend(t.first());
            }
        check_parse(subject, &tokens);
    }
}

/// Text assembled from the markup the parsers look for.
fn markup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("<tool_call>".to_string()),
        Just("</tool_call>".to_string()),
        Just("<|im_end|>".to_string()),
        Just("<|eot_id|>".to_string()),
        Just("<|end|>".to_string()),
        Just("<|return|>".to_string()),
        Just("<|call|>".to_string()),
        Just("<|channel|>".to_string()),
        Just("<|message|>".to_string()),
        Just("<|start|>".to_string()),
        Just("<|constrain|>".to_string()),
        Just("<|python_tag|>".to_string()),
        Just("<|tool_calls_section_begin|>".to_string()),
        Just("<|tool_call_begin|>".to_string()),
        Just("<|tool_call_argument_begin|>".to_string()),
        Just("<|tool_call_end|>".to_string()),
        Just("<|tool_calls_section_end|>".to_string()),
        Just("<｜tool▁calls▁begin｜>".to_string()),
        Just("<｜tool▁call▁begin｜>".to_string()),
        Just("<｜tool▁sep｜>".to_string()),
        Just("<｜tool▁call▁end｜>".to_string()),
        Just("<｜tool▁calls▁end｜>".to_string()),
        Just("<｜end▁of▁sentence｜>".to_string()),
        Just("<arg_key>".to_string()),
        Just("</arg_key>".to_string()),
        Just("<arg_value>".to_string()),
        Just("</arg_value>".to_string()),
        Just("functions.f:0".to_string()),
        Just(" to=functions.f".to_string()),
        Just("analysis".to_string()),
        Just("final".to_string()),
        Just("commentary".to_string()),
        Just(" json".to_string()),
        Just("{\"name\": \"f\", \"arguments\": {}}".to_string()),
        Just("{\"x\": [1, {\"y\": null}]}".to_string()),
        Just("```json\n".to_string()),
        Just("```".to_string()),
        Just("\n\nUser:".to_string()),
        Just("\n".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("\"".to_string()),
        "[a-z ]{1,8}",
        any::<String>().prop_map(|s| s.chars().take(3).collect()),
    ];
    prop::collection::vec(piece, 0..16).prop_map(|v| v.concat())
}

// ---------------------------------------------------------------------------------------------
// GSM8K
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gsm8k_answer_never_panics(text in latexish()) {
        let _ = extract_gsm8k_final_answer(&text);
    }

    #[test]
    fn gsm8k_answer_never_panics_on_any_string(text in any::<String>()) {
        let _ = extract_gsm8k_final_answer(&text);
    }

    #[test]
    fn gsm8k_final_line_answer(work in "[a-z0-9 .+=\n]{0,60}", n in any::<i64>(), sep in prop::sample::select(vec![" ", "", ": ", "  ", "\t"])) {
        let text = format!("{work}\n####{sep}{n}");
        prop_assert_eq!(extract_gsm8k_final_answer(&text), Some(n.to_string()));
    }

    #[test]
    fn gsm8k_from_jsonl_never_panics(lines in prop::collection::vec(jsonl_line(), 0..6)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.jsonl");
        std::fs::write(&path, lines.concat()).unwrap();
        if let Ok(ds) = Gsm8k::from_jsonl(&path) {
            for i in 0..ds.len() {
                let _ = ds.get(i);
            }
        }
    }
}

/// A JSONL line: a well-formed GSM8K row, or something close to one, or noise.
fn jsonl_line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (latexish(), latexish()).prop_map(|(q, a)| {
            let mut v =
                serde_json::to_vec(&serde_json::json!({"question": q, "answer": a})).unwrap();
            v.push(b'\n');
            v
        }),
        (latexish(), any::<i64>()).prop_map(|(q, n)| {
            let mut v = serde_json::to_vec(
                &serde_json::json!({"question": q, "answer": format!("work\n#### {n}")}),
            )
            .unwrap();
            v.push(b'\n');
            v
        }),
        Just(b"\xef\xbb\xbf{\"question\": \"q\", \"answer\": \"#### 1\"}\n".to_vec()),
        Just(b"{\"question\": 1, \"answer\": \"#### 1\"}\n".to_vec()),
        Just(b"[]\n".to_vec()),
        Just(b"\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
    ]
}

// ---------------------------------------------------------------------------------------------
// Run-directory readers (resume)
// ---------------------------------------------------------------------------------------------

/// Bytes that look like a JSONL file: real rows, torn rows, blank lines, noise.
fn jsonl_bytes() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        (any::<u64>(), any::<f64>()).prop_map(|(s, r)| {
            format!("{{\"step\": {s}, \"reward/mean\": {}}}\n", serde_json::json!(r)).into_bytes()
        }),
        (0u64..50).prop_map(|s| format!("{{\"step\": {s}}}\n").into_bytes()),
        (0u64..50).prop_map(|s| {
            format!(
                "{{\"step\": {s}, \"name\": \"{s:06}\", \"backend\": {{\"kind\": \"local\", \"path\": \"x\"}}, \"loop_state\": {{}}}}\n"
            )
            .into_bytes()
        }),
        Just(b"{\"step\": -1}\n".to_vec()),
        Just(b"{\"step\": 1.5}\n".to_vec()),
        Just(b"{\"step\": \"3\"}\n".to_vec()),
        Just(b"{\"step\": 18446744073709551616}\n".to_vec()),
        Just(b"{\"summary\": true}\n".to_vec()),
        Just(b"{\"step\": 3".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"   \r\n".to_vec()),
        Just(b"[1, 2]\n".to_vec()),
        Just(b"\xff\xfe\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..30),
    ];
    prop::collection::vec(line, 0..8).prop_map(|v| v.concat())
}

proptest! {
    // Fewer cases: each one creates files and syncs them.
    #![proptest_config(ProptestConfig { cases: cases(64), ..config() })]

    #[test]
    fn run_dir_readers_never_panic(metrics in jsonl_bytes(), checkpoints in jsonl_bytes(), step in 0u64..60) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("metrics.jsonl"), &metrics).unwrap();
        std::fs::write(path.join("checkpoints.jsonl"), &checkpoints).unwrap();
        // The readers before any repair (a second process reading a live directory) ...
        if let Ok(mut run) = RunDir::create(&path) {
            let _ = run.read_metrics();
            let _ = run.read_checkpoints();
            let _ = run.last_checkpoint();
            let truncated = run.truncate_metrics_from(step);
            // ... and after a truncation, the rows left all come before `step` (a file
            // the truncation refuses, e.g. for a row with `"step": -1`, is left as it was).
            if let (Ok(()), Ok(rows)) = (truncated, run.read_metrics()) {
                for row in rows {
                    if let Some(s) = row.get("step").and_then(|v| v.as_u64()) {
                        prop_assert!(s < step, "row {s} kept past {step}");
                    }
                }
            }
            let row: BTreeMap<String, serde_json::Value> =
                [("step".to_string(), serde_json::json!(step))].into();
            let _ = run.append_metrics(&row);
        }
    }

    #[test]
    fn run_dir_readers_never_panic_on_raw_bytes(metrics in prop::collection::vec(any::<u8>(), 0..200), step in any::<u64>()) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("metrics.jsonl"), &metrics).unwrap();
        std::fs::write(dir.path().join("checkpoints.jsonl"), &metrics).unwrap();
        if let Ok(mut run) = RunDir::create(dir.path()) {
            let _ = run.read_metrics();
            let _ = run.read_checkpoints();
            let _ = run.truncate_metrics_from(step);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tinker little-endian decoders (public in `backend::tinker::proto`)
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "tinker")]
proptest! {
    #![proptest_config(config())]

    #[test]
    fn tinker_le_decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        use rlvr::backend::tinker::proto;
        prop_assert_eq!(proto::parse_i32_le(&bytes).is_some(), bytes.len() % 4 == 0);
        prop_assert_eq!(proto::parse_f32_le(&bytes).is_some(), bytes.len() % 4 == 0);
        prop_assert_eq!(proto::parse_i64_le(&bytes).is_some(), bytes.len() % 8 == 0);
        prop_assert_eq!(proto::parse_bf16_le(&bytes).is_some(), bytes.len() % 2 == 0);
    }

    #[test]
    fn tinker_le_round_trips(v in prop::collection::vec(any::<i32>(), 0..16), w in prop::collection::vec(any::<i64>(), 0..16)) {
        use rlvr::backend::tinker::proto;
        prop_assert_eq!(proto::parse_i32_le(&proto::i32_le(v.iter().copied())), Some(v));
        prop_assert_eq!(proto::parse_i64_le(&proto::i64_le(&w)), Some(w));
    }
}
