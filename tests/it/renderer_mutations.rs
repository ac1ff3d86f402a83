//! The fixture comparison catches a broken renderer: each built-in family, broken on purpose
//! in one place (one token of the generation prompt, one token or one weight of a supervised
//! example, the parse, the stop condition), must fail its cookbook fixtures.
//!
//! It registers broken renderers under the built-in names (registered names take precedence),
//! which must not leak into the other renderer tests: it runs alone in a child process of the
//! test binary (`common::isolate`).

use std::sync::Arc;

use crate::common::renderer_fixtures::{check_family, family_tokenizer, records};
use rlvr::{Renderer, renderer, renderer::ToolSpec};
use rlvr::{
    Result,
    message::Message,
    renderer::{ParseTermination, TrainOnWhat},
    types::{ModelInput, StopCondition, TokenId},
};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Break {
    GenerationToken,
    SupervisedToken,
    SupervisedWeight,
    Parse,
    Stop,
}

struct Broken {
    inner: Arc<dyn Renderer>,
    how: Break,
}

fn bump_last(input: ModelInput) -> ModelInput {
    let mut tokens = input.to_tokens();
    if let Some(t) = tokens.last_mut() {
        *t += 1;
    }
    ModelInput::from_tokens(tokens)
}

impl Renderer for Broken {
    fn generation_prompt(&self, messages: &[Message]) -> Result<ModelInput> {
        let p = self.inner.generation_prompt(messages)?;
        Ok(if self.how == Break::GenerationToken {
            bump_last(p)
        } else {
            p
        })
    }
    fn supervised_example(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        let (input, mut weights) = self.inner.supervised_example(messages, train_on)?;
        match self.how {
            Break::SupervisedToken => Ok((bump_last(input), weights)),
            Break::SupervisedWeight => {
                if let Some(w) = weights.last_mut() {
                    *w = 1.0 - *w;
                }
                Ok((input, weights))
            }
            _ => Ok((input, weights)),
        }
    }
    fn stop(&self) -> StopCondition {
        match (self.inner.stop(), self.how) {
            (StopCondition::Tokens(mut t), Break::Stop) => {
                t.push(7);
                StopCondition::Tokens(t)
            }
            (StopCondition::Strings(mut s), Break::Stop) => {
                s.push("\n".into());
                StopCondition::Strings(s)
            }
            (s, _) => s,
        }
    }
    fn parse_response(&self, tokens: &[TokenId]) -> (Message, ParseTermination) {
        self.inner.parse_response(tokens)
    }
    fn try_parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        let (m, t) = self.inner.try_parse_response(tokens)?;
        Ok(if self.how == Break::Parse {
            let flipped = match t {
                ParseTermination::Malformed => ParseTermination::StopSequence,
                _ => ParseTermination::Malformed,
            };
            (m, flipped)
        } else {
            (m, t)
        })
    }
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        self.inner
            .conversation_prefix_with_tools(tools, system_prompt)
    }
}

/// Families with committed fixtures.
fn families() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/renderers");
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .expect("fixture dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".jsonl.zst").map(str::to_owned)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_family_fails_its_fixtures_when_broken_in_one_place() {
    if !crate::common::isolate::runs_here(
        module_path!(),
        "every_family_fails_its_fixtures_when_broken_in_one_place",
    ) {
        return;
    }
    let families = families();
    assert!(families.len() >= 2, "fixtures missing: {families:?}");
    for family in &families {
        let tok = family_tokenizer(family);
        let names: Vec<String> = {
            let mut n: Vec<String> = records(family)
                .iter()
                .filter_map(|r| r["renderer"].as_str().map(str::to_owned))
                .collect();
            n.dedup();
            n
        };
        // Break the first renderer of the family only.
        let name = names[0].clone();
        let kinds: Vec<String> = records(family)
            .iter()
            .filter(|r| r["renderer"] == name.as_str() && r.get("error").is_none())
            .filter_map(|r| r["kind"].as_str().map(str::to_owned))
            .collect();
        let original = renderer::by_name(&name, tok.clone()).expect("built-in renderer");
        for how in [
            Break::GenerationToken,
            Break::SupervisedToken,
            Break::SupervisedWeight,
            Break::Parse,
            Break::Stop,
        ] {
            let kind = match how {
                Break::GenerationToken => "generation",
                Break::SupervisedToken | Break::SupervisedWeight => "supervised",
                Break::Parse => "parse",
                Break::Stop => "stop",
            };
            if !kinds.iter().any(|k| k == kind) {
                continue; // this fixture file has no such record for the renderer
            }
            let inner = Arc::clone(&original);
            renderer::register(name.clone(), move |_tok| {
                Ok(Arc::new(Broken {
                    inner: Arc::clone(&inner),
                    how,
                }) as Arc<dyn Renderer>)
            });
            let report = check_family(family, Some(&[name.as_str()]));
            assert!(renderer::unregister(&name));
            assert!(
                !report.failures.is_empty(),
                "{family}/{name} broken by {how:?} still matched all {} records",
                report.checked
            );
        }
        // And unbroken, it matches.
        let report = check_family(family, Some(&[name.as_str()]));
        assert!(
            report.failures.is_empty(),
            "{family}/{name}: {:?}",
            report.failures
        );
    }
}
