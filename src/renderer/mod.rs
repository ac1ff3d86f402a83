//! Renderers turn conversations into tokens and sampled tokens back into messages.

use crate::error::Error;
pub(crate) use crate::message::{Content, ContentPart, Message};

pub(crate) mod api;
pub(crate) mod base;
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
pub(crate) mod role_colon;

pub(crate) use api::Renderer;
pub use base::{MessageFormat, RenderContext, RenderedMessage, ToolSpec};
pub use registry::{
    RendererFactory, builtin_names, by_name, is_recommended, known_models, names,
    recommended_renderer, recommended_renderers, register, unregister,
};
pub(crate) use role_colon::RoleColon;

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
