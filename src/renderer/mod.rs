//! Renderers turn conversations into tokens and sampled tokens back into messages.

use crate::error::{Error, Result};
pub use crate::message::{Content, ContentPart, Message, Role, ToolCall, UnparsedToolCall};
use crate::types::{ModelInput, StopCondition, TokenId};

pub mod base;
#[cfg(feature = "chat-template")]
pub mod chat_template;
pub mod deepseek;
pub mod glm5;
pub mod gpt_oss;
pub mod kimi;
pub mod llama3;
pub mod nemotron3;
pub mod qwen3;
mod registry;
mod role_colon;
pub use base::{MessageFormat, RenderContext, RenderedMessage, ToolSpec};
#[cfg(feature = "chat-template")]
pub use chat_template::ChatTemplate;
pub use registry::{
    builtin_names, by_name, is_recommended, known_models, names, recommended_renderer,
    recommended_renderers, register, unregister, RendererFactory,
};
pub use role_colon::{RoleColon, STOP_SEQUENCE};

// The renderer types of each family, by name (each family module has its options types).
pub use deepseek::{DeepSeekV3, DeepSeekV4_1};
pub use glm5::Glm5Renderer;
pub use gpt_oss::GptOssRenderer;
pub use kimi::KimiK2Renderer;
pub use llama3::Llama3Renderer;
pub use nemotron3::Nemotron3Renderer;
pub use qwen3::{Qwen3Renderer, Qwen3VlRenderer, Qwen3_5Renderer, Qwen3_8Renderer};

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
    /// The messages whose `trainable` flag is set (every message must carry one).
    Customized,
}

impl TrainOnWhat {
    /// Every mode, in the cookbook's order.
    pub const ALL: [TrainOnWhat; 7] = [
        TrainOnWhat::LastAssistantMessage,
        TrainOnWhat::LastAssistantTurn,
        TrainOnWhat::AllAssistantMessages,
        TrainOnWhat::AllMessages,
        TrainOnWhat::AllTokens,
        TrainOnWhat::AllUserAndSystemMessages,
        TrainOnWhat::Customized,
    ];
    /// The cookbook's name (`"last_assistant_turn"`).
    pub fn as_str(self) -> &'static str {
        match self {
            TrainOnWhat::LastAssistantMessage => "last_assistant_message",
            TrainOnWhat::LastAssistantTurn => "last_assistant_turn",
            TrainOnWhat::AllAssistantMessages => "all_assistant_messages",
            TrainOnWhat::AllMessages => "all_messages",
            TrainOnWhat::AllTokens => "all_tokens",
            TrainOnWhat::AllUserAndSystemMessages => "all_user_and_system_messages",
            TrainOnWhat::Customized => "customized",
        }
    }
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

    /// Like [`parse_response`](Self::parse_response), but an error where the reference
    /// raises (e.g. the stop token sampled twice: the sampler had the wrong stop condition).
    /// The default never fails.
    fn try_parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        Ok(self.parse_response(tokens))
    }
    /// The registry name of the renderer (`"qwen3"`); `"custom"` unless overridden.
    fn name(&self) -> &str {
        "custom"
    }
    /// A generation prompt for a turn of `role`, with an optional `prefill` the model
    /// continues from. The default supports only the assistant role without prefill.
    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        match (role, prefill) {
            (Role::Assistant, None) => self.generation_prompt(messages),
            _ => Err(Error::Unsupported(format!(
                "renderer `{}` renders generation prompts for the assistant only, without prefill",
                self.name()
            ))),
        }
    }
    /// Whether successive generation prompts of a multi-turn conversation extend each other
    /// (thinking kept in history), so turns can be merged into one datum.
    fn has_extension_property(&self) -> bool {
        false
    }
    /// Messages that declare `tools` (with `system_prompt`) at the start of a conversation,
    /// in the format's own way.
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        let _ = (tools, system_prompt);
        Err(Error::Unsupported(format!(
            "renderer `{}` does not declare tools",
            self.name()
        )))
    }
}

impl<F: MessageFormat> Renderer for F {
    fn generation_prompt(&self, messages: &[Message]) -> Result<ModelInput> {
        MessageFormat::generation_prompt_with(self, messages, Role::Assistant, None)
    }
    fn supervised_example(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        MessageFormat::supervised_example_with(self, messages, train_on)
    }
    fn stop(&self) -> StopCondition {
        MessageFormat::stop(self)
    }
    fn parse_response(&self, tokens: &[TokenId]) -> (Message, ParseTermination) {
        match MessageFormat::parse_response(self, tokens) {
            Ok(parsed) => parsed,
            Err(e) => {
                tracing::warn!(renderer = MessageFormat::name(self), error = %e, "unparseable response");
                let text = self.tokenizer().decode(tokens).unwrap_or_default();
                (Message::assistant(text), ParseTermination::Malformed)
            }
        }
    }
    fn try_parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        MessageFormat::parse_response(self, tokens)
    }
    fn name(&self) -> &str {
        MessageFormat::name(self)
    }
    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        MessageFormat::generation_prompt_with(self, messages, role, prefill)
    }
    fn has_extension_property(&self) -> bool {
        MessageFormat::has_extension_property(self)
    }
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        MessageFormat::conversation_prefix_with_tools(self, tools, system_prompt)
    }
}
