//! The role-colon renderer against the Qwen3-layout tokenizer, checked row by row against the
//! cookbook's `role_colon` (reference/cookbook-semantics.md §a.2–a.3).

use crate::common::{QWEN_ENDOFTEXT, qwen3_tokenizer, tiny_tokenizer};
use rlvr::{
    Renderer, RoleColon,
    message::Message,
    renderer::{ParseTermination, TrainOnWhat},
    types::StopCondition,
};

const STRAWBERRY_Q: &str = r"How many r's are in strawberry? Write your answer in \boxed{} format.";
const STRAWBERRY_A: &str = r"Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \boxed{3}";
const TWO_PLUS_TWO_Q: &str = r"What is 2+2? Write your answer in \boxed{} format.";

fn qwen() -> RoleColon {
    RoleColon::new(qwen3_tokenizer())
}

/// The decoded text of each chunk.
fn chunk_texts(r: &RoleColon, input: &rlvr::types::ModelInput) -> Vec<String> {
    input
        .chunks()
        .iter()
        .map(|c| r.tokenizer().decode(c.tokens()).unwrap())
        .collect()
}

#[test]
fn qwen_tokenizer_has_no_bos_and_endoftext_eos() {
    let tok = qwen3_tokenizer();
    assert_eq!(tok.bos_token_id(), None);
    assert_eq!(tok.eos_token_id(), Some(QWEN_ENDOFTEXT));
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(QWEN_ENDOFTEXT));
}

#[test]
fn generation_prompt_matches_the_math_env_example() {
    let r = qwen();
    let messages = [
        Message::user(STRAWBERRY_Q),
        Message::assistant(STRAWBERRY_A),
        Message::user(TWO_PLUS_TWO_Q),
    ];
    let prompt = r.generation_prompt(&messages).unwrap();
    // No BOS for Qwen; then header, output for each message; then the assistant header.
    let expected_chunks = vec![
        "User:".to_string(),
        format!(" {STRAWBERRY_Q}\n\n"),
        "Assistant:".to_string(),
        format!(" {STRAWBERRY_A}\n\n"),
        "User:".to_string(),
        format!(" {TWO_PLUS_TWO_Q}\n\n"),
        "Assistant:".to_string(),
    ];
    assert_eq!(chunk_texts(&r, &prompt), expected_chunks);
    // Each chunk is the separate encoding of its piece.
    for (chunk, text) in prompt.chunks().iter().zip(&expected_chunks) {
        assert_eq!(chunk.tokens(), r.tokenizer().encode(text).unwrap());
    }
    let joined = r.tokenizer().decode(&prompt.to_tokens()).unwrap();
    assert_eq!(
        joined,
        format!(
            "User: {STRAWBERRY_Q}\n\nAssistant: {STRAWBERRY_A}\n\nUser: {TWO_PLUS_TWO_Q}\n\nAssistant:"
        )
    );
    // Ends right after `Assistant:`, no trailing space.
    assert!(joined.ends_with("\n\nAssistant:"));
    let colon = r.tokenizer().encode(":").unwrap();
    assert!(prompt.to_tokens().ends_with(&colon));
}

#[test]
fn user_question_prompt_encodes_as_measured() {
    // DESIGN.md §7: "User: What is 2+2?\n\nAssistant:" is
    // [1474, 25, 3555, 374, 220, 17, 10, 17, 1939, 71703, 25] in Qwen's vocabulary.
    let r = qwen();
    let prompt = r
        .generation_prompt(&[Message::user("What is 2+2?")])
        .unwrap();
    assert_eq!(
        prompt.to_tokens(),
        vec![1474, 25, 3555, 374, 220, 17, 10, 17, 1939, 71703, 25]
    );
    let chunks: Vec<&[u32]> = prompt.chunks().iter().map(|c| c.tokens()).collect();
    assert_eq!(
        chunks,
        vec![
            &[1474, 25][..],                         // "User:"
            &[3555, 374, 220, 17, 10, 17, 1939][..], // " What is 2+2?\n\n"
            &[71703, 25][..],                        // "Assistant:"
        ]
    );
    // With Qwen's pre-tokenizer every role-colon piece boundary (after `:`, before a role
    // name) is also a pre-token boundary, so here the joined text encodes the same.
    let joined = r
        .tokenizer()
        .encode("User: What is 2+2?\n\nAssistant:")
        .unwrap();
    assert_eq!(prompt.to_tokens(), joined);
}

#[test]
fn pieces_are_encoded_separately_not_as_joined_text() {
    // The tiny tokenizer merges ": " and "\n\nU" across piece boundaries; the renderer must
    // not: header, output and stop overlap are encoded on their own.
    let r = RoleColon::new(tiny_tokenizer().with_bos(None));
    let tok = r.tokenizer().clone();
    let messages = [Message::user("Hi"), Message::assistant("Yo")];
    let (input, _) = r
        .supervised_example(&messages, TrainOnWhat::LastAssistantMessage)
        .unwrap();
    let separate: Vec<u32> = ["User:", " Hi\n\n", "Assistant:", " Yo\n\n", "User:"]
        .iter()
        .flat_map(|p| tok.encode(p).unwrap())
        .collect();
    let joined = tok.encode("User: Hi\n\nAssistant: Yo\n\nUser:").unwrap();
    assert_eq!(input.to_tokens(), separate);
    assert_ne!(
        separate, joined,
        "the fixture must make the encodings differ"
    );
    let colon_space = tok.token_to_id(": ").unwrap();
    assert!(joined.contains(&colon_space));
    assert!(!input.to_tokens().contains(&colon_space));
    // Same text either way.
    assert_eq!(
        tok.decode(&input.to_tokens()).unwrap(),
        "User: Hi\n\nAssistant: Yo\n\nUser:"
    );
}

/// (text, weight) runs of a supervised example, adjacent tokens of equal weight merged.
fn weighted_runs(r: &RoleColon, messages: &[Message], on: TrainOnWhat) -> Vec<(String, f32)> {
    let (input, weights) = r.supervised_example(messages, on).unwrap();
    let tokens = input.to_tokens();
    assert_eq!(tokens.len(), weights.len());
    let mut runs: Vec<(Vec<u32>, f32)> = Vec::new();
    for (&t, &w) in tokens.iter().zip(&weights) {
        match runs.last_mut() {
            Some((ts, lw)) if *lw == w => ts.push(t),
            _ => runs.push((vec![t], w)),
        }
    }
    runs.into_iter()
        .map(|(ts, w)| (r.tokenizer().decode(&ts).unwrap(), w))
        .collect()
}

fn brief_conversation() -> Vec<Message> {
    vec![
        Message::system("Be brief."),
        Message::user("Hi"),
        Message::assistant("Hello!"),
    ]
}

#[test]
fn supervised_example_weights_follow_the_table() {
    let r = qwen();
    let m = brief_conversation();
    let run = |s: &str, w: f32| (s.to_string(), w);

    // LAST_ASSISTANT_MESSAGE (default): everything up to and including `Assistant:` is 0,
    // ` Hello!\n\nUser:` is 1.
    assert_eq!(TrainOnWhat::default(), TrainOnWhat::LastAssistantMessage);
    assert_eq!(
        weighted_runs(&r, &m, TrainOnWhat::LastAssistantMessage),
        vec![
            run("System: Be brief.\n\nUser: Hi\n\nAssistant:", 0.0),
            run(" Hello!\n\nUser:", 1.0),
        ]
    );

    // ALL_MESSAGES: headers 0, every ` content\n\n` 1, the last one also gets `User:`.
    assert_eq!(
        weighted_runs(&r, &m, TrainOnWhat::AllMessages),
        vec![
            run("System:", 0.0),
            run(" Be brief.\n\n", 1.0),
            run("User:", 0.0),
            run(" Hi\n\n", 1.0),
            run("Assistant:", 0.0),
            run(" Hello!\n\nUser:", 1.0),
        ]
    );

    // ALL_TOKENS: BOS only would be 0; Qwen has no BOS, so everything is 1.
    assert_eq!(
        weighted_runs(&r, &m, TrainOnWhat::AllTokens),
        vec![run(
            "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser:",
            1.0
        )]
    );
}

#[test]
fn supervised_example_other_modes() {
    let r = qwen();
    let run = |s: &str, w: f32| (s.to_string(), w);
    // An assistant message that is not last trains ` content\n\n`; the following `User:`
    // is the next message's header and has weight 0.
    let m = vec![
        Message::user("Hi"),
        Message::assistant("Hello!"),
        Message::user("Bye"),
        Message::assistant("Ciao"),
    ];
    assert_eq!(
        weighted_runs(&r, &m, TrainOnWhat::AllAssistantMessages),
        vec![
            run("User: Hi\n\nAssistant:", 0.0),
            run(" Hello!\n\n", 1.0),
            run("User: Bye\n\nAssistant:", 0.0),
            run(" Ciao\n\nUser:", 1.0),
        ]
    );
    assert_eq!(
        weighted_runs(&r, &m, TrainOnWhat::LastAssistantTurn),
        vec![
            run(
                "User: Hi\n\nAssistant: Hello!\n\nUser: Bye\n\nAssistant:",
                0.0
            ),
            run(" Ciao\n\nUser:", 1.0),
        ]
    );
    assert_eq!(
        weighted_runs(&r, &m, TrainOnWhat::AllUserAndSystemMessages),
        vec![
            run("User:", 0.0),
            run(" Hi\n\n", 1.0),
            run("Assistant: Hello!\n\nUser:", 0.0),
            run(" Bye\n\n", 1.0),
            run("Assistant: Ciao\n\nUser:", 0.0),
        ]
    );
    // The last message is not an assistant message: nothing is trained, and its stop
    // overlap is the placeholder `<UNUSED>` (weight 0 like its output).
    let m = vec![Message::user("Hi")];
    assert_eq!(
        weighted_runs(&r, &m, TrainOnWhat::LastAssistantMessage),
        vec![run("User: Hi\n\n<UNUSED>", 0.0)]
    );
    assert!(r.supervised_example(&[], TrainOnWhat::AllTokens).is_err());
}

#[test]
fn bos_is_prepended_once_only_when_the_tokenizer_has_one() {
    let tiny = tiny_tokenizer();
    assert_eq!(tiny.bos_token_id(), Some(0));
    let with_bos = RoleColon::new(tiny.clone());
    let without_bos = RoleColon::new(tiny.with_bos(None));
    let m = brief_conversation();

    let p = with_bos.generation_prompt(&m).unwrap();
    let q = without_bos.generation_prompt(&m).unwrap();
    assert_eq!(p.chunks()[0].tokens(), &[0]);
    let mut expected = vec![0];
    expected.extend(q.to_tokens());
    assert_eq!(p.to_tokens(), expected);
    assert_eq!(p.to_tokens().iter().filter(|&&t| t == 0).count(), 1);

    for on in [
        TrainOnWhat::LastAssistantMessage,
        TrainOnWhat::AllMessages,
        TrainOnWhat::AllTokens,
    ] {
        let (input, weights) = with_bos.supervised_example(&m, on).unwrap();
        let (plain, plain_weights) = without_bos.supervised_example(&m, on).unwrap();
        assert_eq!(input.to_tokens()[0], 0);
        assert_eq!(&input.to_tokens()[1..], plain.to_tokens().as_slice());
        // BOS always has weight 0, even under ALL_TOKENS.
        assert_eq!(weights[0], 0.0);
        assert_eq!(&weights[1..], plain_weights.as_slice());
    }
    // Qwen: no BOS at all.
    let qwen_prompt = qwen().generation_prompt(&m).unwrap();
    assert_eq!(
        qwen_prompt.chunks()[0].tokens(),
        qwen3_tokenizer().encode("System:").unwrap()
    );
}

#[test]
fn stop_condition_is_the_user_turn_string() {
    assert_eq!(
        qwen().stop(),
        StopCondition::Strings(vec!["\n\nUser:".to_string()])
    );
}

/// Parses `text` (+ EOS when `eos`) as sampled tokens.
fn parse(text: &str, eos: bool) -> (String, ParseTermination) {
    let r = qwen();
    let mut tokens = r.tokenizer().encode(text).unwrap();
    if eos {
        tokens.push(QWEN_ENDOFTEXT);
    }
    let (message, termination) = r.parse_response(&tokens);
    assert_eq!(message.role, rlvr::message::Role::Assistant);
    (message.text().into_owned(), termination)
}

#[test]
fn parse_response_termination_table() {
    use ParseTermination::*;
    let rows: &[(&str, bool, &str, ParseTermination)] = &[
        // 1 piece, no EOS: truncated (max_tokens) → malformed.
        (" 4 and", false, "4 and", Malformed),
        // 1 piece, EOS: clean, not a stop sequence.
        (" 4", true, "4", Eos),
        (" 4\n\n", true, "4", Eos),
        // 2 pieces, no EOS: the stop sequence.
        (" 4\n\nUser:", false, "4", StopSequence),
        ("4\n\nUser:", false, "4", StopSequence),
        ("  4\n\nUser:", false, " 4", StopSequence),
        // 2 pieces, EOS: malformed.
        (" 4\n\nUser:", true, "4", Malformed),
        // ≥3 pieces, with or without EOS: malformed, content is the first piece.
        (" 4\n\nUser: hi\n\nUser:", false, "4", Malformed),
        (" 4\n\nUser: hi\n\nUser:", true, "4", Malformed),
        (" 4\n\nUser:\n\nUser:\n\nUser:", false, "4", Malformed),
    ];
    for &(text, eos, content, termination) in rows {
        assert_eq!(
            parse(text, eos),
            (content.to_string(), termination),
            "response {text:?} (EOS: {eos})"
        );
    }
}

#[test]
fn parse_response_strips_only_one_space_and_one_blank_line() {
    use ParseTermination::*;
    assert_eq!(parse(" 4\n\n\n\n", true), ("4\n\n".to_string(), Eos));
    assert_eq!(
        parse(" 4 \n\nUser:", false),
        ("4 ".to_string(), StopSequence)
    );
    // Text after the stop sequence is not part of the content.
    assert_eq!(
        parse(" 4\n\nUser: and more", false),
        ("4".to_string(), StopSequence)
    );
    // Empty responses.
    let r = qwen();
    assert_eq!(
        r.parse_response(&[]),
        (rlvr::message::Message::assistant(""), Malformed)
    );
    assert_eq!(
        r.parse_response(&[QWEN_ENDOFTEXT]),
        (rlvr::message::Message::assistant(""), Eos)
    );
    // EOS only counts as the last token.
    let mut tokens = vec![QWEN_ENDOFTEXT];
    tokens.extend(r.tokenizer().encode(" 4").unwrap());
    assert_eq!(r.parse_response(&tokens).1, Malformed);
}

#[test]
fn sampled_continuation_round_trips_through_the_parser() {
    // What a sampler returns for the prompt: ` answer\n\nUser:` with the stop sequence inside.
    let r = qwen();
    let sampled = r
        .tokenizer()
        .encode(" Let's add: 2+2 = \\boxed{4}.\n\nUser:")
        .unwrap();
    let (message, termination) = r.parse_response(&sampled);
    assert_eq!(message.content, "Let's add: 2+2 = \\boxed{4}.");
    assert_eq!(termination, ParseTermination::StopSequence);
    assert!(termination.is_clean() && termination.is_stop_sequence());
}
