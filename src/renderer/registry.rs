//! Renderers by name (the cookbook's `get_renderer` names), custom registrations, and the
//! recommended renderer of each model the cookbook lists (`model_info`).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use crate::error::{Error, Result};
use crate::renderer::Renderer;
use crate::tokenizer::Tokenizer;

/// Builds a renderer over a tokenizer (see [`register`]).
pub type RendererFactory = Arc<dyn Fn(Tokenizer) -> Result<Arc<dyn Renderer>> + Send + Sync>;

fn custom() -> &'static RwLock<BTreeMap<String, RendererFactory>> {
    static CUSTOM: OnceLock<RwLock<BTreeMap<String, RendererFactory>>> = OnceLock::new();
    CUSTOM.get_or_init(|| RwLock::new(BTreeMap::new()))
}

/// Every built-in renderer name, in the cookbook's order.
const BUILTIN: &[&str] = &[
    "role_colon",
    "llama3",
    "qwen3",
    "qwen3_vl",
    "qwen3_vl_instruct",
    "qwen3_disable_thinking",
    "qwen3_instruct",
    "qwen3_5",
    "qwen3_5_disable_thinking",
    "qwen3_5_preserve_thinking",
    "qwen3_8_xhigh_reasoning",
    "qwen3_8_medium_reasoning",
    "qwen3_8_low_reasoning",
    "qwen3_8_disable_thinking",
    "deepseekv3",
    "deepseekv3_disable_thinking",
    "deepseekv3_thinking",
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
    "glm5_3_max_reasoning",
    "glm5_3_low_reasoning",
    "glm5_3_high_reasoning",
    "kimi_k2",
    "kimi_k25",
    "kimi_k25_disable_thinking",
    "kimi_k26",
    "kimi_k26_disable_thinking",
    "kimi_k26_preserve_thinking",
    "nemotron3",
    "nemotron3_low_thinking",
    "nemotron3_disable_thinking",
    "nemotron3_preserve_thinking",
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_medium_thinking",
    "nemotron3_ultra_preserve_thinking",
    "gpt_oss_no_sysprompt",
    "gpt_oss_low_reasoning",
    "gpt_oss_medium_reasoning",
    "gpt_oss_high_reasoning",
];

/// Names the cookbook backs with the external `tml_renderers` package: listed by
/// [`recommended_renderers`] for the models that use them, but not available here.
const TML_BACKED: &[&str] = &[
    "kimi_k31_pro_max_reasoning",
    "kimi_k31_pro_high_reasoning",
    "kimi_k31_pro_low_reasoning",
    "kimi_k31_pro_disable_thinking",
    "kimi_k31_pro_no_reasoning_effort",
    "tml_v0",
];

/// The built-in renderer names, in the cookbook's order.
pub fn builtin_names() -> &'static [&'static str] {
    BUILTIN
}

/// Every name [`by_name`] accepts: built-ins, then registered names (sorted).
pub fn names() -> Vec<String> {
    let mut out: Vec<String> = BUILTIN.iter().map(|s| (*s).to_owned()).collect();
    let registered = custom().read().unwrap_or_else(|e| e.into_inner());
    out.extend(registered.keys().cloned());
    out
}

/// Registers a renderer under `name` (use a namespaced name, `"myorg/my_format"`, to avoid
/// collisions). A registered name takes precedence over a built-in one, as in the cookbook.
///
/// ```
/// use std::sync::Arc;
/// use rlvr::{renderer, Renderer};
/// use rlvr::RoleColon;
/// renderer::register("doc/my_format", |tok| Ok(Arc::new(RoleColon::new(tok)) as Arc<dyn Renderer>));
/// assert!(renderer::names().contains(&"doc/my_format".to_string()));
/// assert!(renderer::unregister("doc/my_format"));
/// ```
pub fn register<F>(name: impl Into<String>, factory: F)
where
    F: Fn(Tokenizer) -> Result<Arc<dyn Renderer>> + Send + Sync + 'static,
{
    let mut map = custom().write().unwrap_or_else(|e| e.into_inner());
    map.insert(name.into(), Arc::new(factory));
}

/// Removes a registered name; `false` when it was not registered.
pub fn unregister(name: &str) -> bool {
    let mut map = custom().write().unwrap_or_else(|e| e.into_inner());
    map.remove(name).is_some()
}

/// The renderer called `name` over `tokenizer`.
///
/// Errors: [`Error::Renderer`] for an unknown name (listing the known ones);
/// [`Error::Unsupported`] for the names the cookbook backs with `tml_renderers`;
/// [`Error::Tokenizer`] when the tokenizer lacks a special token the format needs.
///
/// ```
/// # fn main() -> rlvr::Result<()> {
/// # let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(br#"{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}"#)?;
/// let r = rlvr::renderer::by_name("role_colon", tokenizer.clone())?;
/// assert_eq!(r.name(), "role_colon");
/// assert!(rlvr::renderer::by_name("no_such_format", tokenizer).is_err());
/// # Ok(())
/// # }
/// ```
pub fn by_name(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    let factory = {
        let map = custom().read().unwrap_or_else(|e| e.into_inner());
        map.get(name).cloned()
    };
    if let Some(factory) = factory {
        return factory(tokenizer);
    }
    use crate::renderer::*;
    match name {
        "role_colon" => Ok(Arc::new(RoleColon::new(tokenizer))),
        n if n == "llama3" => llama3::build(n, tokenizer),
        n if n.starts_with("qwen3") => qwen3::build(n, tokenizer),
        n if n.starts_with("deepseekv") => deepseek::build(n, tokenizer),
        n if n.starts_with("glm5_3") => glm5::build(n, tokenizer),
        n if n.starts_with("kimi_k2") => kimi::build(n, tokenizer),
        n if n.starts_with("nemotron3") => nemotron3::build(n, tokenizer),
        n if n.starts_with("gpt_oss") => gpt_oss::build(n, tokenizer),
        n if TML_BACKED.contains(&n) => Err(Error::Unsupported(format!(
            "renderer `{n}` is implemented by the external tml_renderers package in the \
             cookbook; rlvr does not ship it (use ChatTemplate with the model's chat template)"
        ))),
        n => Err(unknown(n)),
    }
}

/// The error for an unknown renderer name.
pub(crate) fn unknown(name: &str) -> Error {
    Error::Renderer(format!(
        "unknown renderer `{name}`; known: {} (or register one with renderer::register)",
        names().join(", ")
    ))
}

const LLAMA3: &[&str] = &["llama3"];
const ROLE_COLON: &[&str] = &["role_colon"];
const QWEN3: &[&str] = &["qwen3", "qwen3_disable_thinking"];
const QWEN3_INSTRUCT: &[&str] = &["qwen3_instruct"];
const QWEN3_VL_INSTRUCT: &[&str] = &["qwen3_vl_instruct"];
const QWEN3_5: &[&str] = &[
    "qwen3_5",
    "qwen3_5_disable_thinking",
    "qwen3_5_preserve_thinking",
];
const QWEN3_8: &[&str] = &[
    "qwen3_8_xhigh_reasoning",
    "qwen3_8_disable_thinking",
    "qwen3_8_medium_reasoning",
    "qwen3_8_low_reasoning",
];
const DEEPSEEKV3: &[&str] = &["deepseekv3", "deepseekv3_thinking"];
const DEEPSEEKV4_1: &[&str] = &[
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
];
const GPT_OSS: &[&str] = &["gpt_oss_no_sysprompt", "gpt_oss_medium_reasoning"];
const KIMI_K2: &[&str] = &["kimi_k2"];
const KIMI_K25: &[&str] = &["kimi_k25", "kimi_k25_disable_thinking"];
const KIMI_K26: &[&str] = &[
    "kimi_k26",
    "kimi_k26_disable_thinking",
    "kimi_k26_preserve_thinking",
];
const KIMI_K31_PRO: &[&str] = &[
    "kimi_k31_pro_max_reasoning",
    "kimi_k31_pro_high_reasoning",
    "kimi_k31_pro_low_reasoning",
    "kimi_k31_pro_disable_thinking",
    "kimi_k31_pro_no_reasoning_effort",
];
const GLM5_3: &[&str] = &[
    "glm5_3_max_reasoning",
    "glm5_3_low_reasoning",
    "glm5_3_high_reasoning",
];
const NEMOTRON3: &[&str] = &[
    "nemotron3",
    "nemotron3_disable_thinking",
    "nemotron3_preserve_thinking",
];
const NEMOTRON3_SUPER: &[&str] = &[
    "nemotron3",
    "nemotron3_disable_thinking",
    "nemotron3_preserve_thinking",
    "nemotron3_low_thinking",
];
const NEMOTRON3_ULTRA: &[&str] = &[
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_medium_thinking",
    "nemotron3_ultra_preserve_thinking",
];
const NEMOTRON3_LIGHTNING: &[&str] = &[
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_preserve_thinking",
];
const TML_V0: &[&str] = &["tml_v0"];

/// The cookbook's `model_info` table (0.6.1): model id -> recommended renderers, best first.
const MODELS: &[(&str, &[&str])] = &[
    ("meta-llama/Llama-3.1-8B-Instruct", LLAMA3),
    ("meta-llama/Llama-3.2-1B", ROLE_COLON),
    ("meta-llama/Llama-3.2-3B", ROLE_COLON),
    ("meta-llama/Llama-3.1-8B", ROLE_COLON),
    ("meta-llama/Llama-3.1-70B", ROLE_COLON),
    ("meta-llama/Llama-3.3-70B-Instruct", LLAMA3),
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", QWEN3_VL_INSTRUCT),
    ("Qwen/Qwen3-VL-235B-A22B-Instruct", QWEN3_VL_INSTRUCT),
    ("Qwen/Qwen3-8B-Base", ROLE_COLON),
    ("Qwen/Qwen3-30B-A3B-Base", ROLE_COLON),
    ("Qwen/Qwen3-8B", QWEN3),
    ("Qwen/Qwen3-32B", QWEN3),
    ("Qwen/Qwen3-30B-A3B", QWEN3),
    ("Qwen/Qwen3-4B-Instruct-2507", QWEN3_INSTRUCT),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", QWEN3_INSTRUCT),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", QWEN3_INSTRUCT),
    ("Qwen/Qwen3.5-4B", QWEN3_5),
    ("Qwen/Qwen3.5-9B", QWEN3_5),
    ("Qwen/Qwen3.5-9B-Base", ROLE_COLON),
    ("Qwen/Qwen3.5-27B", QWEN3_5),
    ("Qwen/Qwen3.5-35B-A3B", QWEN3_5),
    ("Qwen/Qwen3.5-35B-A3B-Base", ROLE_COLON),
    ("Qwen/Qwen3.5-397B-A17B", QWEN3_5),
    ("Qwen/Qwen3.6-27B", QWEN3_5),
    ("Qwen/Qwen3.6-35B-A3B", QWEN3_5),
    ("Qwen/Qwen3.8-27B", QWEN3_8),
    ("deepseek-ai/DeepSeek-V3.1", DEEPSEEKV3),
    ("deepseek-ai/DeepSeek-V3.1-Base", ROLE_COLON),
    ("deepseek-ai/DeepSeek-V4.1-Flash", DEEPSEEKV4_1),
    ("deepseek-ai/DeepSeek-V4.1-Flash-1017", DEEPSEEKV4_1),
    ("openai/gpt-oss-20b", GPT_OSS),
    ("openai/gpt-oss-120b", GPT_OSS),
    ("moonshotai/Kimi-K2-Thinking", KIMI_K2),
    ("moonshotai/Kimi-K2.5", KIMI_K25),
    ("moonshotai/Kimi-K2.6", KIMI_K26),
    ("moonshotai/Kimi-K3.1-Pro", KIMI_K31_PRO),
    ("zai-org/GLM-5.3", GLM5_3),
    ("zai-org/GLM-5.3-Flash", GLM5_3),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", NEMOTRON3),
    (
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
        NEMOTRON3_SUPER,
    ),
    (
        "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16",
        NEMOTRON3_ULTRA,
    ),
    (
        "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16",
        NEMOTRON3_LIGHTNING,
    ),
    (
        "nvidia/NVIDIA-Nemotron-3.5-Super-VL-120B-A12B-BF16",
        NEMOTRON3_ULTRA,
    ),
    ("thinkingmachines/Inkling", TML_V0),
    ("thinkingmachines/Inkling-Small", TML_V0),
    ("thinkingmachines/Inkling-2-Small", TML_V0),
];

/// The model ids [`recommended_renderers`] knows (the cookbook's `model_info`).
pub fn known_models() -> impl Iterator<Item = &'static str> {
    MODELS.iter().map(|(m, _)| *m)
}

/// The renderers the cookbook recommends for `model` (an `org/name` id; a `:checkpoint`
/// suffix is ignored), best first.
///
/// Errors: [`Error::Config`] (field `model`) for a model the table does not list — never a
/// silent fallback to role-colon. Unlisted `thinkingmachines/Inkling*` ids get `tml_v0`, as
/// in the cookbook.
///
/// ```
/// use rlvr::renderer::{recommended_renderer, recommended_renderers};
/// assert_eq!(recommended_renderer("Qwen/Qwen3-8B").unwrap(), "qwen3");
/// assert_eq!(recommended_renderers("Qwen/Qwen3-8B").unwrap(), ["qwen3", "qwen3_disable_thinking"]);
/// assert_eq!(recommended_renderer("meta-llama/Llama-3.2-1B").unwrap(), "role_colon");
/// assert!(recommended_renderer("acme/unknown-7B").is_err());
/// ```
pub fn recommended_renderers(model: &str) -> Result<&'static [&'static str]> {
    let model = model.split_once(':').map_or(model, |(m, _)| m);
    if !model.contains('/') {
        return Err(Error::config(
            "model",
            format!("model name must be in 'org/model' form, got `{model}`"),
        ));
    }
    if let Some((_, r)) = MODELS.iter().find(|(m, _)| *m == model) {
        return Ok(r);
    }
    if model.starts_with("thinkingmachines/Inkling") {
        return Ok(TML_V0);
    }
    Err(Error::config(
        "model",
        format!(
            "no recommended renderer is known for `{model}` (the cookbook's model table lists \
             {} models); choose one explicitly by name",
            MODELS.len()
        ),
    ))
}

/// The most recommended renderer for `model` (first of [`recommended_renderers`]).
pub fn recommended_renderer(model: &str) -> Result<&'static str> {
    Ok(recommended_renderers(model)?[0])
}

/// Whether `renderer` is among the recommended renderers of `model`; `None` for a model the
/// table does not list.
pub fn is_recommended(model: &str, renderer: &str) -> Option<bool> {
    recommended_renderers(model)
        .ok()
        .map(|r| r.contains(&renderer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recommended_name_is_builtin_or_tml_backed() {
        for (model, names) in MODELS {
            for n in *names {
                assert!(
                    BUILTIN.contains(n) || TML_BACKED.contains(n),
                    "{model} recommends unknown {n}"
                );
            }
        }
    }

    #[test]
    fn checkpoint_suffix_is_ignored_and_unknown_models_fail() {
        assert_eq!(
            recommended_renderer("Qwen/Qwen3-8B:step-10").unwrap(),
            "qwen3"
        );
        assert!(matches!(
            recommended_renderer("Qwen3-8B"),
            Err(Error::Config { .. })
        ));
        assert!(recommended_renderer("Qwen/Qwen9-1B").is_err());
        assert_eq!(
            recommended_renderer("thinkingmachines/Inkling-9").unwrap(),
            "tml_v0"
        );
        assert_eq!(is_recommended("Qwen/Qwen3-8B", "role_colon"), Some(false));
        assert_eq!(is_recommended("x/y", "role_colon"), None);
    }
}
