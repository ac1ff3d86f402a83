//! The renderer trait, re-exported at the crate root: [`Renderer`], and its implementation
//! for every [`MessageFormat`].

use crate::error::{Error, Result};
use crate::message::{Message, Role};
use crate::renderer::{MessageFormat, ParseTermination, ToolSpec, TrainOnWhat};
use crate::types::{ModelInput, StopCondition, TokenId};

/// Turns conversations into model input and sampled tokens back into a message.
///
/// ```
/// use rlvr::{message::Message, renderer::ParseTermination, Renderer, RoleColon};
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
