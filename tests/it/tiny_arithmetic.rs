//! The embedded tiny model in `examples/tiny-arithmetic`: its tokenizer, its output format
//! and the two answer styles GRPO chooses between.

use std::path::PathBuf;

use rlvr::backend::local::{LocalBackend, LocalOptions};
use rlvr::dataset::shuffled_indices;
use rlvr::message::Message;
use rlvr::{
    PolicyBackend, Renderer, RoleColon, Sampler, renderer::ParseTermination, tokenizer::Tokenizer,
    types::SamplingParams,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/tiny-arithmetic")
}

/// The first `n` held-out pairs of the model's README: `shuffled_indices(101², 0)`, pair
/// index i is x = i / 101, y = i % 101.
fn held_out(n: usize) -> Vec<(usize, usize)> {
    shuffled_indices(101 * 101, 0)
        .into_iter()
        .take(n)
        .map(|i| (i / 101, i % 101))
        .collect()
}

/// The cookbook's arithmetic prompt: the few-shot prefix, then the question.
fn messages(x: usize, y: usize) -> Vec<Message> {
    vec![
        Message::user("What is 4 + 5?"),
        Message::assistant("9"),
        Message::user(format!("What is {x} + {y}?")),
    ]
}

#[test]
fn digits_are_tokens_of_their_own() {
    let tok = Tokenizer::from_file(dir().join("tokenizer.json")).unwrap();
    assert_eq!(tok.eos_token_id(), tok.token_to_id("<|endoftext|>"));
    assert!(tok.eos_token_id().is_some());
    assert_eq!(tok.bos_token_id(), None);
    assert!(tok.vocab_size() <= 512, "{}", tok.vocab_size());
    assert_eq!(tok.encode("User:").unwrap().len(), 2);
    assert_eq!(tok.encode("Assistant:").unwrap().len(), 2);
    for n in [0, 7, 42, 100, 200] {
        let text = format!(" {n} + 3 = {}\n\n", n + 3);
        let ids = tok.encode(&text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
        let pieces: Vec<String> = ids.iter().map(|&i| tok.decode(&[i]).unwrap()).collect();
        for d in n.to_string().chars() {
            assert!(pieces.contains(&d.to_string()), "{n}: {pieces:?}");
        }
        assert!(
            pieces
                .iter()
                .all(|p| !p.chars().any(|c| c.is_ascii_digit()) || p.len() == 1),
            "{pieces:?}"
        );
    }
}

#[tokio::test]
async fn the_model_guesses_or_works_the_sum_out() {
    let backend = LocalBackend::from_dir(dir(), LocalOptions::default()).unwrap();
    assert_eq!(
        backend.config().vocab_size,
        backend.tokenizer().vocab_size()
    );
    let renderer = RoleColon::new(backend.tokenizer().clone());
    let sampler = backend.sampler().await.unwrap();
    let (mut worked, mut worked_correct, mut total) = (0, 0, 0);
    for (i, (x, y)) in held_out(8).into_iter().enumerate() {
        let params = SamplingParams::default()
            .max_tokens(32)
            .temperature(1.0)
            .seed(i as u64)
            .stop(renderer.stop());
        let prompt = renderer.generation_prompt(&messages(x, y)).unwrap();
        for s in sampler.sample(&prompt, 8, &params).await.unwrap() {
            let (message, termination) = renderer.parse_response(&s.tokens);
            assert_eq!(termination, ParseTermination::StopSequence, "{message:?}");
            let text = message.text();
            // The guess style is the first number; the worked style `x + y = s`.
            if text != x.to_string() {
                let prefix = format!("{x} + {y} = ");
                let sum = text.strip_prefix(&prefix);
                assert!(
                    sum.is_some_and(|s| s.parse::<usize>().is_ok()),
                    "{x} + {y}: {text:?}"
                );
                worked += 1;
                worked_correct += (sum == Some(&(x + y).to_string())) as usize;
            }
            total += 1;
        }
    }
    // The model starts the worked style about one time in five and then gets the sum right.
    assert!(worked > 0 && worked < total / 2, "{worked} of {total}");
    assert!(
        worked_correct * 10 >= worked * 9,
        "{worked_correct} of {worked}"
    );
}
