//! Checks a renderer family against the fixtures the cookbook produced
//! (`tests/fixtures/renderers/<family>.jsonl.zst`, made by `make_fixtures.py`).
//!
//! Every record is compared: generation prompts and supervised examples token for token (and
//! weight for weight), stop conditions, parses (content, thinking, tool calls, termination),
//! tool-declaration prefixes. A record the cookbook answered with an error must be an error
//! here too. Messages of unparsed tool calls are compared by their raw text and the error's
//! first word (JSON parser messages differ between Python and Rust).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rlvr::{Renderer, renderer, renderer::ToolSpec};
use rlvr::{
    message::Message,
    renderer::{ParseTermination, TrainOnWhat},
    tokenizer::Tokenizer,
    types::StopCondition,
};
use serde_json::Value;

/// The records of `tests/fixtures/renderers/<family>.jsonl.zst` (read once per test binary).
pub fn records(family: &str) -> Vec<Value> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<Value>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(r) = cache.lock().unwrap().get(family) {
        return r.clone();
    }
    let r = read_records(family);
    cache.lock().unwrap().insert(family.to_owned(), r.clone());
    r
}

fn read_records(family: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/fixtures/renderers/{family}.jsonl.zst",
        env!("CARGO_MANIFEST_DIR")
    );
    let compressed = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let text = zstd::decode_all(compressed.as_slice())
        .unwrap_or_else(|e| panic!("decompressing {path}: {e}"));
    String::from_utf8(text)
        .expect("fixture is UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

/// The tokenizer the fixtures of `family` were made with: the Qwen3 vocabulary plus the
/// added tokens of `tests/fixtures/renderers/tokenizers/<family>.json`, with its BOS / EOS
/// (built once per test binary).
pub fn family_tokenizer(family: &str) -> Tokenizer {
    static CACHE: OnceLock<Mutex<HashMap<String, Tokenizer>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().unwrap().get(family) {
        return t.clone();
    }
    let t = build_family_tokenizer(family);
    cache.lock().unwrap().insert(family.to_owned(), t.clone());
    t
}

fn build_family_tokenizer(family: &str) -> Tokenizer {
    let base_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/qwen3-tokenizer.json.zst"
    );
    let compressed = std::fs::read(base_path).expect("reading the Qwen3 tokenizer");
    let json = zstd::decode_all(compressed.as_slice()).expect("decompressing the Qwen3 tokenizer");
    let mut base: Value = serde_json::from_slice(&json).expect("tokenizer JSON");
    let spec_path = format!(
        "{}/tests/fixtures/renderers/tokenizers/{family}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(&spec_path).unwrap_or_else(|e| panic!("reading {spec_path}: {e}")),
    )
    .expect("tokenizer spec JSON");
    if let Some(added) = spec["added_tokens"].as_array() {
        base["added_tokens"]
            .as_array_mut()
            .expect("added_tokens array")
            .extend(added.iter().cloned());
    }
    let tok = Tokenizer::from_bytes(&serde_json::to_vec(&base).expect("JSON")).expect("tokenizer");
    let id = |key: &str| {
        spec[key].as_str().map(|t| {
            tok.token_to_id(t)
                .unwrap_or_else(|| panic!("{key} {t} not in vocabulary"))
        })
    };
    let (bos, eos) = (id("bos_token"), id("eos_token"));
    tok.with_bos(bos).with_eos(eos)
}

fn train_on(name: &str) -> TrainOnWhat {
    TrainOnWhat::ALL
        .into_iter()
        .find(|t| t.as_str() == name)
        .unwrap_or_else(|| panic!("unknown train_on {name}"))
}

fn messages(v: &Value) -> Vec<Message> {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("messages {v}: {e}"))
}

fn tokens(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("token list")
}

/// A parsed message as comparable JSON: unparsed tool calls reduced to raw text and the
/// error's first word.
fn normalize_message(mut v: Value) -> Value {
    if let Some(list) = v
        .get_mut("unparsed_tool_calls")
        .and_then(|l| l.as_array_mut())
    {
        for u in list {
            let first = u["error"]
                .as_str()
                .unwrap_or("")
                .split([':', ' '])
                .next()
                .unwrap_or("")
                .to_owned();
            u["error"] = Value::String(first);
        }
    }
    v
}

/// Outcome of one family check.
#[derive(Debug, Default)]
pub struct Report {
    /// Records compared.
    pub checked: usize,
    /// Mismatches, one line each.
    pub failures: Vec<String>,
}

/// Compares every record of `family` (optionally only renderers in `only`) against the
/// renderer built by [`renderer::by_name`]. Panics with the first mismatches.
pub fn check_family(family: &str, only: Option<&[&str]>) -> Report {
    let tok = family_tokenizer(family);
    let mut report = Report::default();
    let mut cache: std::collections::HashMap<String, Arc<dyn Renderer>> = Default::default();
    for rec in records(family) {
        let name = rec["renderer"].as_str().expect("renderer").to_owned();
        if only.is_some_and(|o| !o.contains(&name.as_str())) {
            continue;
        }
        let r = cache
            .entry(name.clone())
            .or_insert_with(|| {
                renderer::by_name(&name, tok.clone())
                    .unwrap_or_else(|e| panic!("by_name({name}): {e}"))
            })
            .clone();
        let kind = rec["kind"].as_str().expect("kind");
        let case = rec["case"].as_str().unwrap_or("");
        let label = format!(
            "{name} {kind} {case} {}",
            rec["train_on"].as_str().unwrap_or("")
        );
        report.checked += 1;
        let expected_err = rec.get("error").and_then(|e| e.as_str());
        let fail =
            |report: &mut Report, what: String| report.failures.push(format!("{label}: {what}"));
        match kind {
            "stop" => {
                let want = &rec["stop"];
                let got = match r.stop() {
                    StopCondition::Strings(s) => serde_json::json!(s),
                    StopCondition::Tokens(t) => serde_json::json!(t),
                };
                if &got != want {
                    fail(&mut report, format!("stop {got} != {want}"));
                }
            }
            "generation" => {
                let got = r.generation_prompt(&messages(&rec["messages"]));
                match (got, expected_err) {
                    (Ok(input), None) => {
                        let want = tokens(&rec["tokens"]);
                        let got = input.to_tokens();
                        if got != want {
                            fail(&mut report, diff_tokens(&tok, &got, &want));
                        }
                    }
                    (Err(_), Some(_)) => {}
                    (Ok(_), Some(e)) => fail(&mut report, format!("expected error {e}, got Ok")),
                    (Err(e), None) => fail(&mut report, format!("unexpected error {e}")),
                }
            }
            "supervised" => {
                let mode = train_on(rec["train_on"].as_str().expect("train_on"));
                let got = r.supervised_example(&messages(&rec["messages"]), mode);
                match (got, expected_err) {
                    (Ok((input, weights)), None) => {
                        let want = tokens(&rec["tokens"]);
                        let got = input.to_tokens();
                        if got != want {
                            fail(&mut report, diff_tokens(&tok, &got, &want));
                        } else {
                            let want_w: Vec<f32> =
                                serde_json::from_value(rec["weights"].clone()).expect("weights");
                            if weights != want_w {
                                let at = weights.iter().zip(&want_w).position(|(a, b)| a != b);
                                fail(
                                    &mut report,
                                    format!(
                                        "weights differ (len {} vs {}), first at {at:?}",
                                        weights.len(),
                                        want_w.len()
                                    ),
                                );
                            }
                        }
                    }
                    (Err(_), Some(_)) => {}
                    (Ok(_), Some(e)) => fail(&mut report, format!("expected error {e}, got Ok")),
                    (Err(e), None) => fail(&mut report, format!("unexpected error {e}")),
                }
            }
            "parse" => {
                let response = tokens(&rec["response"]);
                let got = r.try_parse_response(&response);
                match (got, expected_err) {
                    (Ok((msg, term)), None) => {
                        let want_msg = normalize_message(rec["message"].clone());
                        let got_msg = normalize_message(serde_json::to_value(&msg).expect("JSON"));
                        if got_msg != want_msg {
                            fail(&mut report, format!("message {got_msg} != {want_msg}"));
                        }
                        let want_term: ParseTermination =
                            serde_json::from_value(rec["termination"].clone())
                                .expect("termination");
                        if term != want_term {
                            fail(
                                &mut report,
                                format!("termination {term:?} != {want_term:?}"),
                            );
                        }
                    }
                    (Err(_), Some(_)) => {}
                    (Ok(_), Some(e)) => fail(&mut report, format!("expected error {e}, got Ok")),
                    (Err(e), None) => fail(&mut report, format!("unexpected error {e}")),
                }
            }
            "tools_prefix" => {
                let tools: Vec<ToolSpec> =
                    serde_json::from_value(rec["tools"].clone()).expect("tools");
                let system = rec["system_prompt"].as_str().unwrap_or("");
                let got = r.conversation_prefix_with_tools(&tools, system);
                match (got, expected_err) {
                    (Ok(prefix), None) => {
                        let got_v = serde_json::to_value(&prefix).expect("JSON");
                        if got_v != rec["messages"] {
                            fail(
                                &mut report,
                                format!("prefix {got_v} != {}", rec["messages"]),
                            );
                        }
                        let mut conv = prefix;
                        conv.push(Message::user("Weather in Paris?"));
                        match r.generation_prompt(&conv) {
                            Ok(input) => {
                                let want = tokens(&rec["generation_tokens"]);
                                let got = input.to_tokens();
                                if got != want {
                                    fail(&mut report, diff_tokens(&tok, &got, &want));
                                }
                            }
                            Err(e) => fail(&mut report, format!("generation with tools: {e}")),
                        }
                    }
                    (Err(_), Some(_)) => {}
                    (Ok(_), Some(e)) => fail(&mut report, format!("expected error {e}, got Ok")),
                    (Err(e), None) => fail(&mut report, format!("unexpected error {e}")),
                }
            }
            other => panic!("unknown record kind {other}"),
        }
    }
    report
}

/// Asserts that every record of `family` matches.
pub fn assert_family(family: &str) {
    let report = check_family(family, None);
    assert!(report.checked > 0, "no records for {family}");
    if !report.failures.is_empty() {
        let shown: Vec<&String> = report.failures.iter().take(15).collect();
        panic!(
            "{} of {} {family} records differ from the cookbook:\n{}",
            report.failures.len(),
            report.checked,
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Where two token lists first differ, with the decoded text around it.
pub fn diff_tokens(tok: &Tokenizer, got: &[u32], want: &[u32]) -> String {
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let lo = at.saturating_sub(8);
    let show = |t: &[u32]| {
        let end = (at + 8).min(t.len());
        tok.decode(&t[lo.min(end)..end]).unwrap_or_default()
    };
    format!(
        "tokens differ at {at} (len {} vs {}): got …{:?}… want …{:?}…",
        got.len(),
        want.len(),
        show(got),
        show(want)
    )
}
