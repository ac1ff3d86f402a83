//! Unit tests of the Kimi pieces the fixtures do not reach: the TypeScript tool declarations
//! over complex schemas (expected text from the cookbook, `kimi_ts_cases.json`) and
//! tool-call parsing details.

use super::*;

#[test]
fn typescript_declarations_match_the_cookbook() {
    let cases: Value = serde_json::from_str(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/renderers/kimi_ts_cases.json"
    )))
    .expect("cases JSON");
    let cases = cases.as_object().expect("object of cases");
    assert!(cases.len() > 10);
    for (name, case) in cases {
        let tools = case["tools"].as_array().expect("tools");
        let got = encode_tools_to_typescript_style(tools);
        match (got, case.get("expected").and_then(Value::as_str)) {
            (Ok(text), Some(want)) => assert_eq!(text, want, "case {name}"),
            (Err(_), None) => {}
            (Ok(text), None) => panic!("case {name}: expected {}, got {text:?}", case["error"]),
            (Err(e), Some(_)) => panic!("case {name}: unexpected error {e}"),
        }
    }
}

#[test]
fn tool_call_sections_parse_like_the_cookbook() {
    let content = "pre<|tool_calls_section_begin|>\
        <|tool_call_begin|> functions.get_weather:0 <|tool_call_argument_begin|> {\"city\": \"Oslo\"} <|tool_call_end|>\
        <|tool_call_begin|>functions.bad:1<|tool_call_argument_begin|>{oops}<|tool_call_end|>\
        <|tool_call_begin|>plain:2<|tool_call_argument_begin|>NaN<|tool_call_end|>\
        <|tool_calls_section_end|>after";
    let (text, section) = split_tool_calls_section(content);
    assert_eq!(text, "pre");
    let (calls, unparsed) = parse_tool_calls_section(section.expect("section"));
    assert_eq!(
        calls,
        vec![
            ToolCall::new("get_weather", "{\"city\": \"Oslo\"}").with_id("functions.get_weather:0"),
            ToolCall::new("plain", "NaN").with_id("plain:2"),
        ]
    );
    assert_eq!(unparsed.len(), 1);
    assert!(unparsed[0].raw_text.contains("functions.bad:1"));
    assert!(unparsed[0].error.starts_with("Invalid JSON"));
    // The singular spelling of the section markers is accepted too.
    let (_, section) = split_tool_calls_section(
        "<|tool_call_section_begin|><|tool_call_begin|>f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_call_section_end|>",
    );
    assert_eq!(
        parse_tool_calls_section(section.expect("section")).0.len(),
        1
    );
    assert!(detect_dangling_tool_block("x<|tool_call_begin|>f:0").is_some());
    assert_eq!(extract_tool_name("a.b.c:3"), "b.c");
    assert_eq!(extract_tool_name("name:3"), "name");
}

#[test]
fn options_by_name_and_back() {
    for name in [
        "kimi_k2",
        "kimi_k25",
        "kimi_k25_disable_thinking",
        "kimi_k26_preserve_thinking",
    ] {
        assert_eq!(
            KimiK2Options::by_name(name).map(|o| o.canonical_name()),
            Some(name)
        );
    }
    assert_eq!(
        KimiK2Options::by_name("kimi_k26"),
        Some(KimiK2Options::k25())
    );
    assert!(KimiK2Options::by_name("kimi_k31_pro_max_reasoning").is_none());
}

/// Kimi's special tokens plus one token per printable ASCII character.
fn toy_tokenizer() -> Tokenizer {
    let specials = [
        "<|im_user|>",
        "<|im_assistant|>",
        "<|im_system|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<think>",
        "</think>",
    ];
    let chars: Vec<String> = (' '..='~').map(String::from).chain(["\n".into()]).collect();
    let vocab: serde_json::Map<String, Value> = chars
        .iter()
        .enumerate()
        .map(|(i, c)| (c.clone(), i.into()))
        .collect();
    let added: Vec<Value> = specials
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
    Tokenizer::from_bytes(json.to_string().as_bytes()).expect("toy tokenizer")
}

#[test]
fn default_system_prompt_goes_after_tool_declare() {
    let r = KimiK2Renderer::new(toy_tokenizer(), KimiK2Options::k2()).expect("renderer");
    let declare = Message::new(Role::ToolDeclare, "[]");
    let user = Message::user("q");
    let roles = |m: &[Message]| m.iter().map(|m| m.role).collect::<Vec<_>>();
    assert_eq!(roles(&r.ensure_system_message(&[])), [Role::System]);
    assert_eq!(
        roles(&r.ensure_system_message(&[declare.clone(), user.clone()])),
        [Role::ToolDeclare, Role::System, Role::User]
    );
    assert_eq!(
        roles(&r.ensure_system_message(std::slice::from_ref(&user))),
        [Role::System, Role::User]
    );
    let given = [Message::system("s"), user];
    assert!(matches!(r.ensure_system_message(&given), Cow::Borrowed(_)));
}

#[test]
fn supervised_examples_split_per_user_turn() {
    let r = KimiK2Renderer::new(toy_tokenizer(), KimiK2Options::k2()).expect("renderer");
    let chat = [
        Message::user("a"),
        Message::assistant("b"),
        Message::user("c"),
        Message::assistant("d"),
    ];
    let one = r
        .supervised_examples(&chat, TrainOnWhat::LastAssistantTurn)
        .expect("examples");
    assert_eq!(one.len(), 1);
    let split = r
        .supervised_examples(&chat, TrainOnWhat::AllAssistantMessages)
        .expect("examples");
    assert_eq!(split.len(), 2);
    assert_eq!(
        split[0],
        r.supervised_example_with(&chat[..2], TrainOnWhat::LastAssistantTurn)
            .expect("example")
    );
    assert_eq!(
        split[1],
        r.supervised_example_with(&chat, TrainOnWhat::LastAssistantTurn)
            .expect("example")
    );
}
