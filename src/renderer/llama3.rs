//! The `llama3` format: Llama 3 Instruct chat headers (the cookbook's `Llama3Renderer`).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::renderer::base::{parse_response_for_stop_token, special_token};
use crate::renderer::{
    Content, ContentPart, MessageFormat, ParseTermination, RenderContext, RenderedMessage, Renderer,
};
use crate::tokenizer::Tokenizer;
use crate::types::{Message, StopCondition, TokenId};

/// The token before the first message.
pub(crate) const BEGIN_OF_TEXT: &str = "<|begin_of_text|>";
/// Opens a role header.
pub(crate) const START_HEADER: &str = "<|start_header_id|>";
/// Closes a role header.
pub(crate) const END_HEADER: &str = "<|end_header_id|>";
/// Ends every message; sampling stops on it.
pub(crate) const EOT: &str = "<|eot_id|>";

/// The renderer called `name` of this family (only `"llama3"`).
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    match name {
        "llama3" => Ok(Arc::new(Llama3Renderer::new(tokenizer)?)),
        n => Err(crate::renderer::registry::unknown(n)),
    }
}

/// The cookbook's `llama3` renderer, for Llama 3 Instruct models.
///
/// Every message is `<|start_header_id|>{role}<|end_header_id|>\n\n` (header) followed by
/// `{content}<|eot_id|>` (output); a conversation starts with `<|begin_of_text|>`; the
/// generation prompt ends with the assistant header; sampling stops at `<|eot_id|>`.
///
/// As in the cookbook: no "Cutting Knowledge Date" preamble is added to the system message
/// (unlike Hugging Face's stock template); content must be text (a string or one text part —
/// thinking parts are an [`Error::Renderer`], images and audio [`Error::Unsupported`]);
/// tool calls attached to a message are not rendered and tools cannot be declared (Llama 3's
/// bare-JSON tool-call format cannot be told apart from ordinary JSON content). The format
/// has the extension property: nothing is stripped from earlier turns.
///
/// ```
/// use rlvr::renderer::llama3::Llama3Renderer;
/// use rlvr::{message::Message, renderer::{ParseTermination, TrainOnWhat}, types::StopCondition, Renderer};
/// # fn main() -> rlvr::Result<()> {
/// // A toy tokenizer: one token per character plus the four Llama 3 special tokens.
/// let chars: Vec<String> = " abcdefghijklmnopqrstuvwxyz12+?\n".chars().map(String::from).collect();
/// let vocab: serde_json::Map<String, serde_json::Value> =
///     chars.iter().enumerate().map(|(i, c)| (c.clone(), i.into())).collect();
/// let specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
/// let added: Vec<serde_json::Value> = specials.iter().enumerate().map(|(i, s)| serde_json::json!({
///     "id": chars.len() + i, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
///     "normalized": false, "special": true,
/// })).collect();
/// let json = serde_json::json!({
///     "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": null,
///     "post_processor": null, "decoder": {"type": "Fuse"},
///     "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": " "},
/// });
/// let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(json.to_string().as_bytes())?;
/// let renderer = Llama3Renderer::new(tokenizer.clone())?;
/// let eot = tokenizer.token_to_id("<|eot_id|>").unwrap();
/// assert_eq!(renderer.stop(), StopCondition::Tokens(vec![eot]));
///
/// let prompt = renderer.generation_prompt(&[Message::user("1+1?")])?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n1+1?<|eot_id|>\
///      <|start_header_id|>assistant<|end_header_id|>\n\n"
/// );
///
/// // Only the answer and its <|eot_id|> carry loss.
/// let chat = [Message::user("1+1?"), Message::assistant("2")];
/// let (input, weights) = renderer.supervised_example(&chat, TrainOnWhat::LastAssistantMessage)?;
/// let trained: Vec<rlvr::types::TokenId> = input.to_tokens().iter().zip(&weights)
///     .filter(|(_, w)| **w > 0.0).map(|(t, _)| *t).collect();
/// assert_eq!(tokenizer.decode(&trained)?, "2<|eot_id|>");
///
/// let (message, termination) = renderer.parse_response(&tokenizer.encode("2<|eot_id|>")?);
/// assert_eq!(message.content, "2");
/// assert_eq!(termination, ParseTermination::StopSequence);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Llama3Renderer {
    tokenizer: Tokenizer,
    bos: TokenId,
    eot: TokenId,
}

impl Llama3Renderer {
    /// A renderer over `tokenizer`.
    ///
    /// Errors: [`Error::Tokenizer`] when the tokenizer lacks `<|begin_of_text|>`,
    /// `<|start_header_id|>`, `<|end_header_id|>` or `<|eot_id|>`.
    pub fn new(tokenizer: Tokenizer) -> Result<Self> {
        let bos = special_token(&tokenizer, BEGIN_OF_TEXT, "llama3")?;
        special_token(&tokenizer, START_HEADER, "llama3")?;
        special_token(&tokenizer, END_HEADER, "llama3")?;
        let eot = special_token(&tokenizer, EOT, "llama3")?;
        Ok(Llama3Renderer {
            tokenizer,
            bos,
            eot,
        })
    }
}

/// The cookbook's `ensure_text`: a string, or exactly one text part. Images and audio are
/// [`Error::Unsupported`]; anything else (thinking parts, several parts) is the cookbook's
/// `RendererError`.
fn ensure_text(content: &Content) -> Result<&str> {
    match content {
        Content::Text(s) => Ok(s),
        Content::Parts(parts) => match parts.as_slice() {
            [ContentPart::Text { text }] => Ok(text),
            _ => {
                content.check_text_only("llama3")?;
                Err(Error::Renderer(format!(
                    "Expected text content, got multimodal content with {} parts",
                    parts.len()
                )))
            }
        },
    }
}

impl MessageFormat for Llama3Renderer {
    fn name(&self) -> &str {
        "llama3"
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn bos_tokens(&self) -> Vec<TokenId> {
        vec![self.bos]
    }

    fn render_message(
        &self,
        message: &Message,
        _ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        let header = format!("{START_HEADER}{}{END_HEADER}\n\n", message.role.as_str());
        let output = format!("{}{EOT}", ensure_text(&message.content)?);
        Ok(RenderedMessage::new(
            self.tokenizer.encode(&header)?,
            self.tokenizer.encode(&output)?,
        ))
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(vec![self.eot])
    }

    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        parse_response_for_stop_token(tokens, &self.tokenizer, self.eot)
    }

    fn has_extension_property(&self) -> bool {
        true
    }
}
