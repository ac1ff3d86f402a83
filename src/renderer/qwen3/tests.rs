//! Unit tests of the Qwen renderers' pieces (tests/it/renderers.rs compares whole renders with
//! the cookbook's fixtures).

use super::common::{parse_qwen3_5_tool_call_xml, strip_visible_content};
use super::*;
use crate::renderer::{MessageFormat, TrainOnWhat};

fn qwen3_tokenizer() -> Tokenizer {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/qwen3-tokenizer.json.zst"
    );
    let bytes = zstd::decode_all(std::fs::read(path).expect("fixture").as_slice()).expect("zstd");
    Tokenizer::from_bytes(&bytes).expect("tokenizer")
}

#[test]
fn framing_round_trips() {
    assert_eq!(frame_thinking("\nr\n"), "<think>\nr\n</think>\n\n");
    assert_eq!(frame_thinking(""), "<think>\n\n</think>\n\n");
    let parts = unframe_thinking(vec![
        ContentPart::thinking("\n\n"),
        ContentPart::text("\n\nx"),
        ContentPart::thinking("\nr\n"),
        ContentPart::text("\ny"),
    ]);
    assert_eq!(
        parts,
        vec![
            ContentPart::text("x"),
            ContentPart::thinking("r"),
            ContentPart::text("y")
        ]
    );
}

#[test]
fn visible_content_is_trimmed_around_thinking() {
    let parts = strip_visible_content(&[
        ContentPart::thinking(" t "),
        ContentPart::text("  "),
        ContentPart::text(" a "),
        ContentPart::text(" b \n"),
    ]);
    assert_eq!(
        parts,
        vec![
            ContentPart::thinking(" t "),
            ContentPart::text(""),
            ContentPart::text("a "),
            ContentPart::text(" b"),
        ]
    );
}

#[test]
fn xml_tool_calls_parse_like_the_cookbook() {
    let call = parse_qwen3_5_tool_call_xml(
        "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=s>\na b\n</parameter>\n\
         <parameter=o>\n{\"k\": true}\n</parameter>\n</function>\n</tool_call>",
    )
    .unwrap();
    assert_eq!(call.name, "f");
    assert_eq!(call.arguments, r#"{"n": 3, "s": "a b", "o": {"k": true}}"#);
    let bad = |raw: &str| parse_qwen3_5_tool_call_xml(raw).unwrap_err().error;
    assert_eq!(
        bad("<tool_call>{}</tool_call>"),
        "Malformed Qwen3.5 tool call XML"
    );
    assert!(
        bad("<tool_call><function=f>x<parameter=a>1</parameter></function></tool_call>")
            .starts_with("Unexpected non-parameter")
    );
    assert!(
        bad("<tool_call><function=f><parameter=a>1</parameter>x</function></tool_call>")
            .starts_with("Unexpected trailing")
    );
}

#[test]
fn every_name_builds_and_unknown_names_fail() {
    let tok = qwen3_tokenizer();
    for name in [
        "qwen3",
        "qwen3_disable_thinking",
        "qwen3_instruct",
        "qwen3_vl",
        "qwen3_vl_instruct",
        "qwen3_5",
        "qwen3_5_disable_thinking",
        "qwen3_5_preserve_thinking",
        "qwen3_8_xhigh_reasoning",
        "qwen3_8_medium_reasoning",
        "qwen3_8_low_reasoning",
        "qwen3_8_disable_thinking",
    ] {
        let r = build(name, tok.clone()).unwrap();
        assert_eq!(r.name(), name);
    }
    assert!(build("qwen3_9", tok).is_err());
}

#[test]
fn images_are_unsupported() {
    let tok = qwen3_tokenizer();
    let image = Message::user(vec![
        ContentPart::Image {
            image: "https://example.com/cat.png".into(),
        },
        ContentPart::text("What is this?"),
    ]);
    for name in ["qwen3", "qwen3_vl", "qwen3_5", "qwen3_8_low_reasoning"] {
        let r = build(name, tok.clone()).unwrap();
        assert!(
            matches!(
                r.generation_prompt(std::slice::from_ref(&image)),
                Err(Error::Unsupported(_))
            ),
            "{name}"
        );
    }
}

#[test]
fn missing_im_end_is_a_tokenizer_error() {
    let json = br#"{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,
        "post_processor":null,"decoder":null,
        "model":{"type":"BPE","vocab":{"a":0},"merges":[],"unk_token":"a"}}"#;
    let tok = Tokenizer::from_bytes(json).unwrap();
    assert!(matches!(
        Qwen3_5Renderer::new(tok),
        Err(Error::Tokenizer(_))
    ));
}

#[test]
fn qwen3_8_reasoning_instruction_is_added_once() {
    let r = Qwen3_8Renderer::with_options(
        qwen3_tokenizer(),
        Qwen3_8Options {
            reasoning_effort: ReasoningEffort::Low,
            ..Qwen3_8Options::default()
        },
    )
    .unwrap();
    let chat = [Message::system("  Be brief. "), Message::user("Hi")];
    let once = r.normalize_messages(&chat).unwrap().into_owned();
    let expected = format!("{}\n\nBe brief.", ReasoningEffort::Low.instructions());
    assert_eq!(once[0].content, expected);
    assert_eq!(r.normalize_messages(&once).unwrap().into_owned(), once);
    // A conversation without a system message gets one; an empty one is dropped at medium.
    let added = r.normalize_messages(&chat[1..]).unwrap();
    assert_eq!(added[0].content, ReasoningEffort::Low.instructions());
    let medium = Qwen3_8Renderer::with_options(
        qwen3_tokenizer(),
        Qwen3_8Options {
            reasoning_effort: ReasoningEffort::Medium,
            ..Qwen3_8Options::default()
        },
    )
    .unwrap();
    let empty_system = [Message::system(" "), Message::user("Hi")];
    let dropped = medium.normalize_messages(&empty_system).unwrap();
    assert_eq!(dropped.len(), 1);
}

#[test]
fn qwen3_5_prefill_is_restored_when_parsing() {
    let tok = qwen3_tokenizer();
    let r = Qwen3_5Renderer::new(tok.clone()).unwrap();
    let sampled = tok.encode("Let me see.\n</think>\n\n42<|im_end|>").unwrap();
    let (message, termination) = MessageFormat::parse_response(&r, &sampled).unwrap();
    assert_eq!(termination, ParseTermination::StopSequence);
    assert_eq!(
        message.content,
        Content::Parts(vec![
            ContentPart::thinking("Let me see."),
            ContentPart::text("42")
        ])
    );
    // The prefill is in the prompt, so it is not trained.
    let chat = [
        Message::user("?"),
        Message::assistant(vec![
            ContentPart::thinking("Let me see."),
            ContentPart::text("42"),
        ]),
    ];
    let (input, weights) = r
        .supervised_example(&chat, TrainOnWhat::LastAssistantMessage)
        .unwrap();
    let tokens = input.to_tokens();
    let trained: Vec<u32> = tokens
        .iter()
        .zip(&weights)
        .filter(|(_, w)| **w > 0.0)
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(trained, sampled);
}
