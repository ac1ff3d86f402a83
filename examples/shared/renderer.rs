//! What the examples that train a named model share (`#[path]`-included by `gsm8k.rs` and
//! `math.rs`; not an example itself).

use anyhow::bail;
use rlvr::renderer::{is_recommended, recommended_renderer, recommended_renderers};

/// The renderer to use for `model`: `requested`, or the model's recommended one.
///
/// Without `--renderer`, a model the cookbook's table does not list is an error (never a
/// silent role-colon). A requested name must exist; one the table does not recommend for the
/// model is used with the cookbook's warning (`warn_if_renderer_not_recommended`).
pub fn choose_renderer(model: &str, requested: Option<&str>) -> anyhow::Result<String> {
    let known = rlvr::renderer::names();
    let Some(name) = requested else {
        return match recommended_renderer(model) {
            Ok(name) => Ok(name.to_string()),
            Err(_) => bail!(
                "no recommended renderer is known for model `{model}`: the cookbook's model \
                 table does not list it.\nPass --renderer NAME: role_colon for a base model, or \
                 the chat renderer of the model's family. Known renderers: {}",
                known.join(", ")
            ),
        };
    };
    if !known.iter().any(|n| n == name) {
        bail!(
            "unknown renderer `{name}` (--renderer); known renderers: {}",
            known.join(", ")
        );
    }
    if is_recommended(model, name) == Some(false) {
        let recommended = recommended_renderers(model)?
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(
            "Renderer '{name}' is not recommended for model '{model}'. Recommended renderer(s): \
             {recommended}. Using an incompatible renderer can silently degrade training quality \
             (e.g., prefilling tokens the model was never trained on)."
        );
    }
    Ok(name.to_string())
}
