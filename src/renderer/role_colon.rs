//! The `role_colon` format: plain `Role: content` text, for base models.

use crate::error::Result;
use crate::renderer::{MessageFormat, ParseTermination, RenderContext, RenderedMessage};
use crate::tokenizer::Tokenizer;
use crate::types::{Message, Role, StopCondition, TokenId};

/// The stop sequence of the role-colon format.
const STOP_SEQUENCE: &str = "\n\nUser:";

/// The cookbook's `role_colon` renderer.
///
/// Each message is `"Role:"` (header) + `" content\n\n"` (output), each piece tokenized
/// separately; the prompt ends right after `"Assistant:"`; a supervised example ends with the
/// stop overlap `"User:"`; sampling stops at `"\n\nUser:"`. BOS is prepended only when the
/// tokenizer has one.
///
/// ```
/// use rlvr::{message::Message, renderer::TrainOnWhat, types::StopCondition, Renderer, RoleColon};
/// # fn main() -> rlvr::Result<()> {
/// // A character-level toy tokenizer (one token per character), built inline.
/// let chars: Vec<String> = " UserAitan:?+12\n".chars().map(String::from).collect();
/// let vocab: serde_json::Map<String, serde_json::Value> =
///     chars.iter().enumerate().map(|(i, c)| (c.clone(), i.into())).collect();
/// let json = serde_json::json!({
///     "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
///     "post_processor": null, "decoder": {"type": "Fuse"},
///     "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": " "},
/// });
/// let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(json.to_string().as_bytes())?;
/// let renderer = RoleColon::new(tokenizer.clone());
/// assert_eq!(renderer.stop(), StopCondition::Strings(vec!["\n\nUser:".into()]));
/// let chat = [Message::user("1+1?"), Message::assistant("2")];
/// let (input, weights) = renderer.supervised_example(&chat, TrainOnWhat::LastAssistantTurn)?;
/// let text = tokenizer.decode(&input.to_tokens())?;
/// assert_eq!(text, "User: 1+1?\n\nAssistant: 2\n\nUser:");
/// // Only the assistant's answer (and the stop overlap) is trained on.
/// let trained: String = input.to_tokens().iter().zip(&weights)
///     .filter(|(_, w)| **w > 0.0)
///     .map(|(t, _)| tokenizer.decode(&[*t]).unwrap())
///     .collect();
/// assert_eq!(trained, " 2\n\nUser:");
/// # Ok(())
/// # }
/// ```
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
        Role::Developer => "Developer:",
        Role::ToolDeclare => "Tool_declare:",
        Role::GptOssSystem => "_gptoss_internal_system:",
    }
}

impl RoleColon {
    /// The stop sequence of the role-colon format, `"\n\nUser:"`.
    pub const STOP_SEQUENCE: &'static str = STOP_SEQUENCE;

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

impl MessageFormat for RoleColon {
    fn name(&self) -> &str {
        "role_colon"
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn bos_tokens(&self) -> Vec<TokenId> {
        self.bos()
    }

    fn render_message(
        &self,
        message: &Message,
        _ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        Ok(RenderedMessage {
            header: self.tokenizer.encode(header(message.role))?,
            output: vec![
                self.tokenizer
                    .encode(&Self::output_text(message.content.as_text()?))?,
            ],
            stop_overlap: self.tokenizer.encode(Self::stop_overlap(message.role))?,
        })
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Strings(vec![STOP_SEQUENCE.to_string()])
    }

    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        Ok(self.parse(tokens))
    }
}

impl RoleColon {
    fn parse(&self, tokens: &[TokenId]) -> (Message, ParseTermination) {
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
        // `text.split(STOP_SEQUENCE)`: the first piece, and whether there are 1, 2 or more.
        static STOP: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(STOP_SEQUENCE));
        let mut stops = STOP.find_iter(text.as_bytes());
        let first_stop = stops.next();
        let first = &text[..first_stop.unwrap_or(text.len())];
        let first = first.strip_prefix(' ').unwrap_or(first);
        let content = first.strip_suffix("\n\n").unwrap_or(first);
        let termination = match (first_stop, stops.next(), eos_seen) {
            (None, _, false) => ParseTermination::Malformed,
            (None, _, true) => ParseTermination::Eos,
            (Some(_), None, false) => ParseTermination::StopSequence,
            (Some(_), None, true) => ParseTermination::Malformed,
            (Some(_), Some(_), _) => {
                tracing::warn!(
                    pieces = 3 + stops.count(),
                    "role_colon response contains the stop sequence more than once"
                );
                ParseTermination::Malformed
            }
        };
        (Message::assistant(content), termination)
    }
}
