//! Renderers of the `nemotron3` family (work in progress: not yet ported).

use std::sync::Arc;

use crate::error::Result;
use crate::renderer::Renderer;
use crate::tokenizer::Tokenizer;

/// The renderer called `name` of this family.
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    let _ = tokenizer;
    Err(crate::renderer::registry::unknown(name))
}
