//! Evaluation: the built-in held-out-set evaluation and pluggable [`Evaluator`]s.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::backend::Sampler;
use crate::error::Result;

/// A custom evaluation run on the current policy every `eval_every` steps and at the end,
/// next to the built-in held-out-set evaluation (the cookbook's `SamplingClientEvaluator`).
///
/// Its metrics are logged as `{name}/{key}` in the step's row.
///
/// ```
/// use std::collections::BTreeMap;
/// use rlvr::trainer::Evaluator;
/// use rlvr::{ModelInput, Sampler, SamplingParams};
///
/// /// Mean completion length of one fixed prompt.
/// struct Length(ModelInput);
///
/// #[async_trait::async_trait]
/// impl<S: Sampler> Evaluator<S> for Length {
///     fn name(&self) -> &str { "length" }
///     async fn evaluate(&self, sampler: &S, _step: u64) -> rlvr::Result<BTreeMap<String, f64>> {
///         let out = sampler.sample(&self.0, 4, &SamplingParams::default().max_tokens(16)).await?;
///         let mean = out.iter().map(|s| s.tokens.len() as f64).sum::<f64>() / 4.0;
///         Ok(BTreeMap::from([("mean_tokens".to_string(), mean)]))
///     }
/// }
/// ```
#[async_trait]
pub trait Evaluator<S: Sampler>: Send + Sync {
    /// The metric prefix (filesystem- and key-safe, e.g. `"math500"`).
    fn name(&self) -> &str;
    /// Evaluates the policy behind `sampler` after `step` updates.
    async fn evaluate(&self, sampler: &S, step: u64) -> Result<BTreeMap<String, f64>>;
}
