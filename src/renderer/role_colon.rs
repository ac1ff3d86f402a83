//! The `role_colon` format: plain `Role: content` text, for base models.

use crate::error::{Error, Result};
use crate::renderer::{ParseTermination, Renderer, TrainOnWhat};
use crate::tokenizer::Tokenizer;
use crate::types::{Message, ModelInput, Role, StopCondition, TokenId};

/// The stop sequence of the role-colon format.
pub const STOP_SEQUENCE: &str = "\n\nUser:";

/// The cookbook's `role_colon` renderer.
///
/// Each message is `"Role:"` (header) + `" content\n\n"` (output), each piece tokenized
/// separately; the prompt ends right after `"Assistant:"`; a supervised example ends with the
/// stop overlap `"User:"`; sampling stops at `"\n\nUser:"`. BOS is prepended only when the
/// tokenizer has one.
#[derive(Debug, Clone)]
pub struct RoleColon {
    tokenizer: Tokenizer,
}

/// Python's `str.capitalize()` of the role name.
fn header(role: Role) -> &'static str {
    match role {
        Role::System => "System:",
        Role::User => "User:",
        Role::Assistant => "Assistant:",
        Role::Tool => "Tool:",
    }
}

impl RoleColon {
    /// A renderer over `tokenizer`.
    pub fn new(tokenizer: Tokenizer) -> Self {
        RoleColon { tokenizer }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn bos(&self) -> Vec<TokenId> {
        self.tokenizer.bos_token_id().into_iter().collect()
    }

    fn output_text(content: &str) -> String {
        format!(" {content}\n\n")
    }

    fn stop_overlap(role: Role) -> &'static str {
        match role {
            Role::Assistant => "User:",
            _ => "<UNUSED>",
        }
    }
}

impl Renderer for RoleColon {
    fn generation_prompt(&self, messages: &[Message]) -> Result<ModelInput> {
        let mut input = ModelInput::from_tokens(self.bos());
        for m in messages {
            input.push_tokens(self.tokenizer.encode(header(m.role))?);
            input.push_tokens(self.tokenizer.encode(&Self::output_text(&m.content))?);
        }
        input.push_tokens(self.tokenizer.encode(header(Role::Assistant))?);
        Ok(input)
    }

    fn supervised_example(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        if messages.is_empty() {
            return Err(Error::Renderer(
                "supervised_example needs at least one message".into(),
            ));
        }
        let last_user = messages.iter().rposition(|m| m.role == Role::User);
        let n = messages.len();
        let mut input = ModelInput::new();
        let mut weights = Vec::new();
        let mut push = |input: &mut ModelInput, tokens: Vec<TokenId>, w: f32| {
            weights.extend(std::iter::repeat_n(w, tokens.len()));
            input.push_tokens(tokens);
        };
        push(&mut input, self.bos(), 0.0);
        for (i, m) in messages.iter().enumerate() {
            let is_last = i + 1 == n;
            let header_w = if train_on == TrainOnWhat::AllTokens {
                1.0
            } else {
                0.0
            };
            let trained = match train_on {
                TrainOnWhat::LastAssistantMessage => is_last && m.role == Role::Assistant,
                TrainOnWhat::LastAssistantTurn => {
                    m.role == Role::Assistant && last_user.is_none_or(|u| i > u)
                }
                TrainOnWhat::AllAssistantMessages => m.role == Role::Assistant,
                TrainOnWhat::AllMessages | TrainOnWhat::AllTokens => true,
                TrainOnWhat::AllUserAndSystemMessages => {
                    matches!(m.role, Role::User | Role::System)
                }
            };
            let out_w = if trained { 1.0 } else { 0.0 };
            push(&mut input, self.tokenizer.encode(header(m.role))?, header_w);
            push(
                &mut input,
                self.tokenizer.encode(&Self::output_text(&m.content))?,
                out_w,
            );
            if is_last {
                push(
                    &mut input,
                    self.tokenizer.encode(Self::stop_overlap(m.role))?,
                    out_w,
                );
            }
        }
        Ok((input, weights))
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Strings(vec![STOP_SEQUENCE.to_string()])
    }

    fn parse_response(&self, tokens: &[TokenId]) -> (Message, ParseTermination) {
        let (body, eos_seen) = match (tokens.last(), self.tokenizer.eos_token_id()) {
            (Some(&last), Some(eos)) if last == eos => (&tokens[..tokens.len() - 1], true),
            _ => (tokens, false),
        };
        // Decoding a sampled sequence cannot fail for ids in the vocabulary; for ids outside it
        // the best-effort message is empty and the termination malformed.
        let text = match self.tokenizer.decode(body) {
            Ok(t) => t,
            Err(_) => return (Message::assistant(""), ParseTermination::Malformed),
        };
        let pieces: Vec<&str> = text.split(STOP_SEQUENCE).collect();
        let first = pieces[0];
        let first = first.strip_prefix(' ').unwrap_or(first);
        let content = first.strip_suffix("\n\n").unwrap_or(first);
        let termination = match (pieces.len(), eos_seen) {
            (1, false) => ParseTermination::Malformed,
            (1, true) => ParseTermination::Eos,
            (2, false) => ParseTermination::StopSequence,
            (2, true) => ParseTermination::Malformed,
            _ => {
                tracing::warn!(
                    pieces = pieces.len(),
                    "role_colon response contains the stop sequence more than once"
                );
                ParseTermination::Malformed
            }
        };
        (Message::assistant(content), termination)
    }
}
