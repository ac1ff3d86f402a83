//! `ChatTemplate` against Hugging Face transformers' `apply_chat_template` on real templates
//! (fixtures from tests/fixtures/chat_templates/make_fixtures.py), plus its own rules: stop
//! tokens, weights per `TrainOnWhat`, response parsing, loading from a tokenizer config.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rlvr::renderer::chat_template::{ChatTemplate, ChatTemplateOptions, template_message};
use rlvr::{
    Error, Renderer,
    message::{ContentPart, Message, ToolCall},
    renderer::{ParseTermination, TrainOnWhat},
    tokenizer::Tokenizer,
    types::StopCondition,
};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates")
}

fn records() -> Vec<Value> {
    let path = fixture_dir().join("fixtures.jsonl.zst");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let text = String::from_utf8(zstd::decode_all(bytes.as_slice()).expect("zstd")).expect("utf8");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

fn meta() -> Value {
    let path = fixture_dir().join("templates.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("templates.json")).expect("JSON")
}

fn template_text(name: &str) -> String {
    let file = meta()[name]["file"].as_str().expect("file").to_owned();
    std::fs::read_to_string(fixture_dir().join("templates").join(file)).expect("template")
}

/// The Qwen3 vocabulary plus the template's added special tokens (as make_fixtures.py built it).
fn tokenizer_for(name: &str) -> Tokenizer {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-tokenizer.json.zst");
    let raw = zstd::decode_all(std::fs::read(path).expect("tokenizer").as_slice()).expect("zstd");
    let mut base: Value = serde_json::from_slice(&raw).expect("tokenizer JSON");
    let added = meta()[name]["added_tokens"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    base["added_tokens"]
        .as_array_mut()
        .expect("added_tokens")
        .extend(added);
    Tokenizer::from_bytes(&serde_json::to_vec(&base).expect("JSON")).expect("tokenizer")
}

fn options_for(name: &str, kwargs: &Value, tools: &Value) -> ChatTemplateOptions {
    let m = &meta()[name];
    let mut options = ChatTemplateOptions::default();
    if let Some(bos) = m["bos_token"].as_str() {
        options = options.bos_token(bos);
    }
    if let Some(eos) = m["eos_token"].as_str() {
        options = options.eos_token(eos);
    }
    if let Some(vars) = kwargs.as_object() {
        for (k, v) in vars {
            options = options.variable(k.clone(), v.clone());
        }
    }
    if let Some(tools) = tools.as_array() {
        options = options.tools_json(tools.clone());
    }
    options
}

fn renderer(name: &str, tokenizer: &Tokenizer, options: ChatTemplateOptions) -> ChatTemplate {
    ChatTemplate::from_template_str(&template_text(name), tokenizer.clone(), options)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A documented difference: Jinja2 raises on `{% for x in none %}`, MiniJinja loops zero
/// times (Hermes 3's tool-use template rendered without tools).
const NONE_NOT_ITERABLE: &str = "'NoneType' object is not iterable";

fn check_error(
    what: &str,
    expected: &str,
    got: rlvr::Result<impl std::fmt::Debug>,
) -> Option<String> {
    match got {
        Ok(_) if expected == NONE_NOT_ITERABLE => None,
        Ok(v) => Some(format!(
            "{what}: transformers raised `{expected}`, we produced {v:?}"
        )),
        Err(Error::Renderer(m)) if m == expected => None,
        Err(e) => Some(format!(
            "{what}: transformers raised `{expected}`, we raised `{e}`"
        )),
    }
}

#[test]
fn renders_like_transformers() {
    let records = records();
    let mut tokenizers: HashMap<String, Tokenizer> = HashMap::new();
    let mut mismatches: Vec<String> = Vec::new();
    let mut checked = 0;
    for rec in &records {
        let name = rec["template"].as_str().expect("template");
        let id = format!(
            "{name}/{}/{}",
            rec["variant"].as_str().unwrap(),
            rec["case"].as_str().unwrap()
        );
        let tokenizer = tokenizers
            .entry(name.to_owned())
            .or_insert_with(|| tokenizer_for(name))
            .clone();
        let r = renderer(
            name,
            &tokenizer,
            options_for(name, &rec["kwargs"], &rec["tools"]),
        );
        let messages: Vec<Message> =
            serde_json::from_value(rec["messages"].clone()).expect("rlvr messages");

        for (key, agp) in [("generation", true), ("full", false)] {
            let expected = &rec[key];
            let what = format!("{id} {key}");
            if let Some(err) = expected["error"].as_str() {
                mismatches.extend(check_error(&what, err, r.render(&messages, agp)));
                continue;
            }
            let text = expected["text"].as_str().expect("text");
            let ids: Vec<u32> = serde_json::from_value(expected["ids"].clone()).expect("ids");
            match r.render(&messages, agp) {
                Ok(t) if t == text => {}
                Ok(t) => mismatches.push(format!("{what}: text\n  ours: {t:?}\n  hf:   {text:?}")),
                Err(e) => {
                    mismatches.push(format!("{what}: we raised `{e}`, transformers rendered"))
                }
            }
            let tokens = if agp {
                r.generation_prompt(&messages).map(|m| m.to_tokens())
            } else {
                r.supervised_example(&messages, TrainOnWhat::LastAssistantMessage)
                    .map(|(m, _)| m.to_tokens())
            };
            match tokens {
                Ok(t) if t == ids => {}
                Ok(t) => mismatches.push(format!("{what}: ids\n  ours: {t:?}\n  hf:   {ids:?}")),
                // No weights for this conversation (checked below): compare the plain encoding.
                Err(_) if !agp && rec["last_assistant_weights"]["error"].is_string() => {
                    let ours = r
                        .render(&messages, false)
                        .and_then(|t| tokenizer.encode(&t));
                    if ours.as_ref().ok() != Some(&ids) {
                        mismatches.push(format!("{what}: ids\n  ours: {ours:?}\n  hf:   {ids:?}"));
                    }
                }
                Err(e) => mismatches.push(format!("{what}: tokens: we raised `{e}`")),
            }
            checked += 1;
        }

        let expected = &rec["last_assistant_weights"];
        let got = r.supervised_example(&messages, TrainOnWhat::LastAssistantMessage);
        let what = format!("{id} last_assistant_weights");
        if let Some(err) = expected["error"].as_str() {
            match got {
                Ok(_) if err == NONE_NOT_ITERABLE => {}
                Ok((_, w)) => mismatches.push(format!(
                    "{what}: transformers failed (`{err}`), we gave {w:?}"
                )),
                Err(Error::Renderer(_)) => {}
                Err(e) => mismatches.push(format!("{what}: wrong error kind {e:?}")),
            }
        } else {
            let want: Vec<f32> = serde_json::from_value(expected.clone()).expect("weights");
            match got {
                Ok((_, w)) if w == want => {}
                Ok((input, w)) => {
                    let toks = input.to_tokens();
                    let ours: Vec<u32> = toks
                        .iter()
                        .zip(&w)
                        .filter(|(_, w)| **w > 0.0)
                        .map(|(t, _)| *t)
                        .collect();
                    let hf: Vec<u32> = toks
                        .iter()
                        .zip(&want)
                        .filter(|(_, w)| **w > 0.0)
                        .map(|(t, _)| *t)
                        .collect();
                    mismatches.push(format!(
                        "{what}:\n  ours trains {:?}\n  hf trains   {:?}",
                        tokenizer.decode(&ours).unwrap_or_default(),
                        tokenizer.decode(&hf).unwrap_or_default()
                    ));
                }
                Err(e) => mismatches.push(format!("{what}: we raised `{e}`")),
            }
        }
        checked += 1;
    }
    for m in mismatches.iter().take(8) {
        eprintln!("MISMATCH {m}\n");
    }
    eprintln!(
        "{checked} checks over {} records, {} mismatches",
        records.len(),
        mismatches.len()
    );
    assert!(records.len() >= 150, "fixture too small: {}", records.len());
    assert!(mismatches.is_empty(), "{} mismatches", mismatches.len());
}

fn qwen3() -> (Tokenizer, ChatTemplate) {
    let tok = tokenizer_for("qwen3");
    let r = renderer(
        "qwen3",
        &tok,
        options_for("qwen3", &Value::Null, &Value::Null),
    );
    (tok, r)
}

fn id(tok: &Tokenizer, t: &str) -> u32 {
    tok.token_to_id(t)
        .unwrap_or_else(|| panic!("{t} not in vocabulary"))
}

#[test]
fn stop_tokens_follow_the_documented_rule() {
    let cases: [(&str, &[&str]); 7] = [
        ("qwen3", &["<|im_end|>"]),
        ("llama3.3", &["<|eot_id|>", "<|eom_id|>"]),
        ("phi3.5", &["<|endoftext|>", "<|end|>"]),
        ("gemma2", &["<eos>", "<end_of_turn>"]),
        ("mistral-nemo", &["</s>"]),
        ("hermes3-tool-use", &["<|im_end|>"]),
        ("chatml-peer", &["<|im_end|>"]),
    ];
    for (name, want) in cases {
        let tok = tokenizer_for(name);
        let r = renderer(name, &tok, options_for(name, &Value::Null, &Value::Null));
        let want: Vec<u32> = want.iter().map(|t| id(&tok, t)).collect();
        assert_eq!(r.stop(), StopCondition::Tokens(want.clone()), "{name}");
        assert_eq!(r.stop_tokens(), want.as_slice());
        assert_eq!(r.name(), "chat_template");
    }
    // Without an eos_token option, the tokenizer's EOS (Qwen3's guess: <|endoftext|>).
    let tok = tokenizer_for("qwen3");
    let r =
        ChatTemplate::from_template_str(&template_text("qwen3"), tok.clone(), Default::default())
            .unwrap();
    assert_eq!(
        r.stop_tokens(),
        &[id(&tok, "<|endoftext|>"), id(&tok, "<|im_end|>")]
    );
    // An override replaces the rule; it must name single tokens.
    let r = ChatTemplate::from_template_str(
        &template_text("qwen3"),
        tok.clone(),
        ChatTemplateOptions::default().stop_tokens(["<|endoftext|>"]),
    )
    .unwrap();
    assert_eq!(r.stop_tokens(), &[id(&tok, "<|endoftext|>")]);
    let err = ChatTemplate::from_template_str(
        &template_text("qwen3"),
        tok,
        ChatTemplateOptions::default().stop_tokens(["not a token"]),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Tokenizer(_)), "{err:?}");
}

fn trained_text(tok: &Tokenizer, r: &ChatTemplate, chat: &[Message], on: TrainOnWhat) -> String {
    let (input, weights) = r
        .supervised_example(chat, on)
        .unwrap_or_else(|e| panic!("{on:?}: {e}"));
    let tokens = input.to_tokens();
    assert_eq!(tokens.len(), weights.len());
    // Trained tokens, with a `|` wherever a trained run is interrupted.
    let mut out = String::new();
    let mut prev = false;
    for (t, w) in tokens.iter().zip(&weights) {
        let on = *w > 0.0;
        if on {
            if !prev && !out.is_empty() {
                out.push('|');
            }
            out.push_str(&tok.decode(&[*t]).unwrap());
        }
        prev = on;
    }
    out
}

#[test]
fn weights_follow_train_on_what() {
    let tok = tokenizer_for("chatml-peer");
    let r = renderer(
        "chatml-peer",
        &tok,
        options_for("chatml-peer", &Value::Null, &Value::Null),
    );
    let chat = [
        Message::system("Be brief."),
        Message::user("Hi"),
        Message::assistant("Hello"),
        Message::user("2+2?"),
        Message::assistant("4"),
        Message::assistant("Sure."),
    ];
    use TrainOnWhat::*;
    assert_eq!(
        trained_text(&tok, &r, &chat, LastAssistantMessage),
        "Sure.<|im_end|>\n"
    );
    assert_eq!(
        trained_text(&tok, &r, &chat, LastAssistantTurn),
        "4<|im_end|>\n|Sure.<|im_end|>\n"
    );
    assert_eq!(
        trained_text(&tok, &r, &chat, AllAssistantMessages),
        "Hello<|im_end|>\n|4<|im_end|>\n|Sure.<|im_end|>\n"
    );
    assert_eq!(
        trained_text(&tok, &r, &chat, AllUserAndSystemMessages),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n|\
         <|im_start|>user\n2+2?<|im_end|>\n"
    );
    // Headers exist only for assistant messages: user delimiters are trained.
    assert_eq!(
        trained_text(&tok, &r, &chat, AllMessages),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n|\
         Hello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n|4<|im_end|>\n|Sure.<|im_end|>\n"
    );
    let full = r.render(&chat, false).unwrap();
    assert_eq!(trained_text(&tok, &r, &chat, AllTokens), full);
    let custom: Vec<Message> = chat
        .iter()
        .enumerate()
        .map(|(i, m)| m.clone().with_trainable(i == 2 || i == 3))
        .collect();
    assert_eq!(
        trained_text(&tok, &r, &custom, Customized),
        "Hello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    );
    // The flag is required exactly with Customized.
    assert!(r.supervised_example(&custom, AllMessages).is_err());
    assert!(r.supervised_example(&chat, Customized).is_err());
    assert!(r.supervised_example(&[], AllMessages).is_err());

    // AllTokens never trains the leading BOS the template writes.
    let tok = tokenizer_for("llama3.3");
    let r = renderer(
        "llama3.3",
        &tok,
        options_for("llama3.3", &Value::Null, &Value::Null),
    );
    let chat = [Message::user("Hi"), Message::assistant("Hello")];
    let (input, weights) = r.supervised_example(&chat, AllTokens).unwrap();
    assert_eq!(input.to_tokens()[0], id(&tok, "<|begin_of_text|>"));
    assert_eq!(weights[0], 0.0);
    assert!(weights[1..].iter().all(|w| *w == 1.0));
    assert_eq!(
        trained_text(&tok, &r, &chat, LastAssistantMessage),
        "Hello<|eot_id|>"
    );
}

#[test]
fn qwen3_multi_turn_thinking() {
    let (tok, r) = qwen3();
    let chat = [
        Message::user("1+1?"),
        Message::assistant(vec![ContentPart::thinking("Add."), ContentPart::text("2")]),
        Message::user("2+2?"),
        Message::assistant(vec![
            ContentPart::thinking("Add again."),
            ContentPart::text("4"),
        ]),
    ];
    // The last turn keeps its reasoning, earlier ones lose it: the last message trains fine…
    assert_eq!(
        trained_text(&tok, &r, &chat, TrainOnWhat::LastAssistantMessage),
        "<think>\nAdd again.\n</think>\n\n4<|im_end|>\n"
    );
    // …but message 1 has no span of its own in the whole rendering.
    let err = r
        .supervised_example(&chat, TrainOnWhat::AllAssistantMessages)
        .unwrap_err();
    let Error::Renderer(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("not prefix-preserving at message 2"), "{msg}");

    // enable_thinking=false: the generation prompt closes an empty think block, which is not
    // trained; a turn that reasoned cannot be trained after such a prompt.
    let r = renderer(
        "qwen3",
        &tok,
        options_for(
            "qwen3",
            &serde_json::json!({"enable_thinking": false}),
            &Value::Null,
        ),
    );
    let plain = [Message::user("1+1?"), Message::assistant("2")];
    assert_eq!(
        trained_text(&tok, &r, &plain, TrainOnWhat::LastAssistantMessage),
        "2<|im_end|>\n"
    );
    assert!(
        r.supervised_example(&chat[..2], TrainOnWhat::LastAssistantMessage)
            .is_err()
    );
}

#[test]
fn parse_response_splits_thinking_and_tool_calls() {
    let (tok, r) = qwen3();
    let enc = |s: &str| tok.encode(s).unwrap();

    let (m, t) = r.parse_response(&enc("<think>\nLet me add.\n</think>\n\n4<|im_end|>"));
    assert_eq!(t, ParseTermination::StopSequence);
    assert_eq!(
        m.content,
        rlvr::message::Content::Parts(vec![
            ContentPart::thinking("Let me add."),
            ContentPart::text("4")
        ])
    );
    // Rendering the parsed message back gives the sampled text.
    let back = r
        .render(&[Message::user("2+2?"), m.clone()], false)
        .unwrap();
    assert!(
        back.ends_with("<|im_start|>assistant\n<think>\nLet me add.\n</think>\n\n4<|im_end|>\n"),
        "{back:?}"
    );

    // A response that starts inside a think block the prompt opened.
    let (m, _) = r.parse_response(&enc("hmm\n</think>\n\nok<|im_end|>"));
    assert_eq!(m.thinking().as_deref(), Some("hmm"));
    assert_eq!(m.text(), "ok");

    // Tool calls in Qwen's <tool_call> blocks.
    let (m, t) = r.parse_response(&enc(
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
    ));
    assert_eq!(t, ParseTermination::StopSequence);
    assert_eq!(
        m.tool_calls,
        vec![ToolCall::new("get_weather", "{\"city\": \"Paris\"}")]
    );
    assert_eq!(m.text(), "Checking.\n");
    let (m, _) = r.parse_response(&enc(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}<|im_end|>",
    ));
    assert!(m.tool_calls.is_empty());
    assert_eq!(m.unparsed_tool_calls.len(), 1);

    // Plain text stays a string; no stop token is malformed; anything after it is an error.
    let (m, t) = r.parse_response(&enc("4<|im_end|>"));
    assert_eq!(
        (m.content.clone(), t),
        ("4".into(), ParseTermination::StopSequence)
    );
    let (m, t) = r.parse_response(&enc("4 and more"));
    assert_eq!(
        (m.content.clone(), t),
        ("4 and more".into(), ParseTermination::Malformed)
    );
    let doubled = enc("4<|im_end|><|im_end|>");
    assert!(matches!(
        r.try_parse_response(&doubled),
        Err(Error::Renderer(_))
    ));
    assert_eq!(r.parse_response(&doubled).1, ParseTermination::Malformed);

    // A template without <think> leaves the text alone.
    let tok = tokenizer_for("phi3.5");
    let r = renderer(
        "phi3.5",
        &tok,
        options_for("phi3.5", &Value::Null, &Value::Null),
    );
    let (m, t) = r.parse_response(&tok.encode("<think>x</think>y<|end|>").unwrap());
    assert_eq!(
        (m.content, t),
        ("<think>x</think>y".into(), ParseTermination::StopSequence)
    );
}

#[test]
fn template_errors_and_messages() {
    let tok = tokenizer_for("gemma2");
    let r = renderer(
        "gemma2",
        &tok,
        options_for("gemma2", &Value::Null, &Value::Null),
    );
    let err = r
        .generation_prompt(&[Message::system("x"), Message::user("y")])
        .unwrap_err();
    assert!(
        matches!(err, Error::Renderer(ref m) if m == "System role not supported"),
        "{err:?}"
    );
    assert!(r.generation_prompt(&[]).is_err());

    let (_, r) = qwen3();
    let image = Message::user(vec![ContentPart::Image {
        image: "http://x/y.png".into(),
    }]);
    assert!(matches!(
        r.generation_prompt(&[image]),
        Err(Error::Unsupported(_))
    ));
    let bad = Message::assistant("").with_tool_calls(vec![ToolCall::new("f", "{not json")]);
    assert!(matches!(
        r.render(&[Message::user("a"), bad], false),
        Err(Error::Renderer(_))
    ));
    assert!(
        ChatTemplate::from_template_str("{% if %}", tokenizer_for("qwen3"), Default::default())
            .is_err()
    );

    // The dict a message becomes.
    let m = Message::assistant(vec![
        ContentPart::thinking("r"),
        ContentPart::text("a"),
        ContentPart::text("b"),
    ])
    .with_tool_calls(vec![ToolCall::new("f", "{\"x\": 1}").with_id("c1")]);
    assert_eq!(
        template_message(&m).unwrap(),
        serde_json::json!({"thinking": "r", "role": "assistant", "content": "ab", "reasoning_content": "r",
            "tool_calls": [{"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}]})
    );
    let t = Message::tool_response("c1", "f", "out");
    assert_eq!(
        template_message(&t).unwrap(),
        serde_json::json!({"role": "tool", "content": "out", "tool_call_id": "c1", "name": "f"})
    );
}

#[test]
fn generation_prompt_with_prefill_and_globals() {
    let (tok, r) = qwen3();
    let p = r
        .generation_prompt_with(
            &[Message::user("Hi")],
            rlvr::message::Role::Assistant,
            Some("<think>\n"),
        )
        .unwrap();
    assert_eq!(
        tok.decode(&p.to_tokens()).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    );
    assert!(
        r.generation_prompt_with(&[Message::user("Hi")], rlvr::message::Role::User, None)
            .is_err()
    );

    // strftime_now is the current (UTC) time, as a string.
    let r = ChatTemplate::from_template_str(
        "{{ strftime_now('%Y') }}|{{ bos_token }}|{{ greeting }}",
        tok.clone(),
        ChatTemplateOptions::default()
            .bos_token("<s>")
            .variable("greeting", "hey")
            .eos_token("<|im_end|>"),
    )
    .unwrap();
    let out = r.render(&[Message::user("x")], false).unwrap();
    let (year, rest) = out.split_once('|').unwrap();
    assert!(
        year.len() == 4 && year.parse::<u32>().unwrap() >= 2024,
        "{out}"
    );
    assert_eq!(rest, "<s>|hey");
}

#[test]
fn loads_from_a_tokenizer_config_and_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let template = template_text("chatml-peer");
    let config = serde_json::json!({
        "eos_token": {"content": "<|im_end|>", "special": true},
        "pad_token": "<|endoftext|>",
        "chat_template": template,
    });
    let config_path = dir.path().join("tokenizer_config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let tok = crate::common::qwen3_tokenizer();
    let r =
        ChatTemplate::from_tokenizer_config(&config_path, tok.clone(), Default::default()).unwrap();
    assert_eq!(r.stop_tokens(), &[id(&tok, "<|im_end|>")]);
    let text = r.render(&[Message::user("Hi")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );

    // Named templates: tool_use when tools are declared, default otherwise.
    let named = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": [
        {"name": "default", "template": "D{{ eos_token }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]});
    let r =
        ChatTemplate::from_tokenizer_config_json(&named, tok.clone(), Default::default()).unwrap();
    assert_eq!(
        r.render(&[Message::user("x")], false).unwrap(),
        "D<|im_end|>"
    );
    let spec = rlvr::renderer::ToolSpec {
        name: "f".into(),
        description: "d".into(),
        parameters: serde_json::json!({"type": "object"}),
    };
    let r = ChatTemplate::from_tokenizer_config_json(
        &named,
        tok.clone(),
        ChatTemplateOptions::default().tools(&[spec]),
    )
    .unwrap();
    assert_eq!(r.render(&[Message::user("x")], false).unwrap(), "T1");
    assert!(
        ChatTemplate::from_tokenizer_config_json(
            &serde_json::json!({}),
            tok.clone(),
            Default::default()
        )
        .is_err()
    );

    // chat_template.jinja beside the config wins; from_dir loads tokenizer.json too.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "J{{ messages[0].content }}\n",
    )
    .unwrap();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-tokenizer.json.zst");
    let raw = zstd::decode_all(std::fs::read(path).unwrap().as_slice()).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), raw).unwrap();
    let r = ChatTemplate::from_dir(dir.path(), Default::default()).unwrap();
    // Jinja drops the template's single trailing newline.
    assert_eq!(r.render(&[Message::user("x")], false).unwrap(), "Jx");
    assert_eq!(r.stop_tokens(), &[id(&tok, "<|im_end|>")]);
}

#[test]
fn supervised_tokens_are_one_encoding_weighted_by_offsets() {
    let tok = tokenizer_for("chatml-peer");
    let r = renderer(
        "chatml-peer",
        &tok,
        options_for("chatml-peer", &Value::Null, &Value::Null),
    );
    let chat = [Message::user("Hi"), Message::assistant("\n\nanswer")];
    let (input, _) = r
        .supervised_example(&chat, TrainOnWhat::LastAssistantMessage)
        .unwrap();
    let full = r.render(&chat, false).unwrap();
    assert_eq!(input.to_tokens(), tok.encode(&full).unwrap());
    // Encoding the generation prompt and the answer separately would split the header's
    // "\n" from the answer's "\n\n", which Qwen's tokenizer merges into one token…
    let prompt = r.render(&chat[..1], true).unwrap();
    let separate = [
        tok.encode(&prompt).unwrap(),
        tok.encode(&full[prompt.len()..]).unwrap(),
    ]
    .concat();
    assert_ne!(separate, input.to_tokens());
    // …which is trained, as it holds answer text (transformers' assistant-mask rule).
    assert_eq!(
        trained_text(&tok, &r, &chat, TrainOnWhat::LastAssistantMessage),
        "\n\n\nanswer<|im_end|>\n"
    );
}
