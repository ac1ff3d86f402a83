//! The embedded tiny model in `examples/tiny-wordproblems`: its tokenizer and its output format.

use std::path::PathBuf;

use rlvr::backend::local::{LocalBackend, LocalOptions};
use rlvr::dataset::word_problems::{MAX_OPERAND, answer_text};
use rlvr::{Dataset, dataset::word_problems::WordProblems};
use rlvr::{
    PolicyBackend, Renderer, RoleColon, Sampler, renderer::ParseTermination, tokenizer::Tokenizer,
    types::SamplingParams,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/tiny-wordproblems")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(dir().join("tokenizer.json")).unwrap()
}

#[test]
fn special_tokens_come_from_the_config() {
    let tok = tokenizer();
    assert_eq!(tok.eos_token_id(), tok.token_to_id("<|endoftext|>"));
    assert!(tok.eos_token_id().is_some());
    assert_eq!(tok.bos_token_id(), None);
    assert!(tok.vocab_size() <= 512, "{}", tok.vocab_size());
}

#[test]
fn role_colon_pieces_are_short() {
    let tok = tokenizer();
    let len = |s: &str| tok.encode(s).unwrap().len();
    assert_eq!(len("User:"), 2);
    assert_eq!(len("Assistant:"), 2);
    assert_eq!(len(" "), 1);
    assert_eq!(len("\n\n"), 1);
    // Every number the model may answer is one token inside the box.
    for n in 0..=2 * MAX_OPERAND + 1 {
        let ids = tok.encode(&format!(" {}\n\n", answer_text(n))).unwrap();
        let pieces: Vec<String> = ids.iter().map(|&i| tok.decode(&[i]).unwrap()).collect();
        assert!(pieces.contains(&n.to_string()), "{n}: {pieces:?}");
    }
}

#[test]
fn decode_inverts_encode() {
    let tok = tokenizer();
    let set = WordProblems::new(5, 300).unwrap();
    let mut texts: Vec<String> = set
        .problems()
        .map(|p| format!(" {}\n\n", p.question))
        .collect();
    texts.push(format!(" {}\n\nUser:", answer_text(17)));
    // Text the tokenizer never saw still round-trips (byte-level alphabet).
    texts.push("Zoë paid 12.50 € for 3 crêpes — {nested {braces}} \t ok?".into());
    for t in texts {
        let ids = tok.encode(&t).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), t);
    }
}

#[tokio::test]
async fn the_model_answers_in_the_trained_format() {
    let backend = LocalBackend::from_dir(dir(), LocalOptions::default()).unwrap();
    assert_eq!(
        backend.config().vocab_size,
        backend.tokenizer().vocab_size()
    );
    let renderer = RoleColon::new(backend.tokenizer().clone());
    let (_, test) = WordProblems::new(0, WordProblems::space_size())
        .unwrap()
        .split(1000)
        .unwrap();
    let sampler = backend.sampler().await.unwrap();
    let params = SamplingParams::default()
        .max_tokens(32)
        .temperature(0.0)
        .stop(renderer.stop());
    for i in 0..5 {
        let p = test.get(i).unwrap();
        let prompt = renderer.generation_prompt(&p.messages).unwrap();
        let out = sampler.sample(&prompt, 1, &params).await.unwrap();
        let (message, termination) = renderer.parse_response(&out[0].tokens);
        assert_eq!(termination, ParseTermination::StopSequence, "{message:?}");
        let n = rlvr::reward::extract_boxed(&message.text()).unwrap();
        let boxed = answer_text(n.parse().unwrap());
        // Either the guess style or the worked style (` 7 + 5 = 12. ` before the answer).
        let text = message.text();
        let work = text.strip_suffix(&boxed);
        assert!(
            work.is_some_and(|w| w.is_empty() || w.ends_with(&format!(" = {n}. "))),
            "{message:?}"
        );
    }
}
