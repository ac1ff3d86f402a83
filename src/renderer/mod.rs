//! Renderers turn conversations into tokens and sampled tokens back into messages.

use crate::error::Result;
pub use crate::types::{Message, Role};
use crate::types::{ModelInput, StopCondition, TokenId};

mod role_colon;
pub use role_colon::{RoleColon, STOP_SEQUENCE};

/// How a sampled response ended, as seen by the renderer's parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParseTermination {
    /// The renderer's stop sequence ended the response.
    StopSequence,
    /// The model produced its end-of-sequence token.
    Eos,
    /// Truncated or otherwise not well formed.
    Malformed,
}

impl ParseTermination {
    /// Anything but [`Malformed`](Self::Malformed).
    pub fn is_clean(self) -> bool {
        !matches!(self, ParseTermination::Malformed)
    }
    /// Only [`StopSequence`](Self::StopSequence).
    pub fn is_stop_sequence(self) -> bool {
        matches!(self, ParseTermination::StopSequence)
    }
}

/// Which tokens of a supervised example get weight 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainOnWhat {
    /// The output of the last message, if it is an assistant message.
    #[default]
    LastAssistantMessage,
    /// Assistant messages after the last user message.
    LastAssistantTurn,
    /// Every assistant message.
    AllAssistantMessages,
    /// Every message's output (headers excluded).
    AllMessages,
    /// Every token but BOS.
    AllTokens,
    /// User and system messages.
    AllUserAndSystemMessages,
}

/// Turns conversations into model input and sampled tokens back into a message.
///
/// ```
/// use rlvr::{Message, ParseTermination, Renderer, RoleColon};
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
/// let tokenizer = rlvr::Tokenizer::from_bytes(json.to_string().as_bytes())?;
/// let renderer = RoleColon::new(tokenizer.clone());
/// // Any renderer works through the trait object.
/// let r: &dyn Renderer = &renderer;
/// let prompt = r.generation_prompt(&[Message::user("1+1?")])?;
/// assert_eq!(tokenizer.decode(&prompt.to_tokens())?, "User: 1+1?\n\nAssistant:");
/// let sampled = tokenizer.encode(" 2\n\nUser:")?;
/// let (message, termination) = r.parse_response(&sampled);
/// assert_eq!(message.content, "2");
/// assert_eq!(termination, ParseTermination::StopSequence);
/// # Ok(())
/// # }
/// ```
pub trait Renderer: Send + Sync {
    /// Tokens of `messages` followed by the header of an assistant turn, ready for sampling.
    fn generation_prompt(&self, messages: &[Message]) -> Result<ModelInput>;
    /// Tokens of `messages` with a 0/1 weight per token, for supervised training.
    fn supervised_example(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)>;
    /// Where sampling should stop.
    fn stop(&self) -> StopCondition;
    /// Parses sampled tokens into an assistant message, with how the response ended.
    /// A best-effort message is always returned, even when malformed.
    fn parse_response(&self, tokens: &[TokenId]) -> (Message, ParseTermination);
}
