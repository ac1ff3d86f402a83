//! Evaluation: the built-in held-out-set evaluation (the same sample and grade phases as
//! training, with the eval sampling settings) and pluggable [`Evaluator`]s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tracing::Instrument;

use crate::backend::{PolicyBackend, Sampler};
use crate::dataset::Problem;
use crate::error::{Error, Result};
use crate::reward::RewardFn;

use super::sample::EVAL_DOMAIN;
use super::{GrpoTrainer, grade, metrics, sample};

/// A custom evaluation run on the current policy every `eval_every` steps and at the end,
/// next to the built-in held-out-set evaluation (the cookbook's `SamplingClientEvaluator`).
///
/// Its metrics are logged as `{name}/{key}` in the step's row.
///
/// ```
/// use std::collections::BTreeMap;
/// use rlvr::trainer::Evaluator;
/// use rlvr::{types::{ModelInput, SamplingParams}, Sampler};
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

impl<B: PolicyBackend, R: RewardFn> GrpoTrainer<B, R> {
    /// Evaluates the current policy: the eval dataset (`test/...` metrics) and every custom
    /// evaluator (`{name}/...`). Empty when there is nothing to evaluate.
    pub async fn evaluate(&mut self) -> Result<BTreeMap<String, f64>> {
        self.setup().await?;
        self.ensure_sampler().await?;
        let Some(sampler) = self.sampler.as_ref() else {
            return Err(Error::Backend("no sampler".into()));
        };
        let step = self.state.next_step;
        let t = Instant::now();
        let mut out = BTreeMap::new();
        if let Some(ds) = &self.eval_dataset {
            let n = self
                .config
                .eval
                .max_problems
                .map_or(ds.len(), |m| m.min(ds.len()));
            let problems: Vec<Arc<Problem>> = (0..n)
                .map(|i| ds.get(i).map(Arc::new))
                .collect::<Result<_>>()?;
            let params = self.sampling_params(
                self.config
                    .eval
                    .max_tokens
                    .unwrap_or(self.config.max_tokens),
                self.config.eval.temperature,
            );
            let seed = self.config.seed ^ EVAL_DOMAIN;
            let group_size = self.config.eval.group_size;
            // Units: one per group sampled and one per graded completion.
            let bar = self
                .progress
                .phase("eval", n.saturating_mul(1 + group_size) as u64);
            let sampled = sample::sample(
                sampler,
                self.env_builder.as_ref(),
                &problems,
                group_size,
                &params,
                seed,
                step,
                &bar,
            )
            .instrument(tracing::info_span!("eval_sampling", step))
            .await?;
            let groups = grade::grade(
                sampler,
                sampled,
                &params,
                self.config.max_turns,
                self.renderer.as_ref(),
                step,
                &bar,
            )
            .instrument(tracing::info_span!("eval_grading", step))
            .await?;
            bar.finish();
            out.extend(metrics::trajectory_metrics(&groups, "test/"));
        }
        for e in &self.evaluators {
            let m = e
                .evaluate(sampler, step)
                .instrument(tracing::info_span!("evaluator", name = e.name()))
                .await?;
            for (k, v) in m {
                out.insert(format!("{}/{k}", e.name()), v);
            }
        }
        if !out.is_empty() {
            out.insert("time/run_evals".into(), t.elapsed().as_secs_f64());
        }
        Ok(out)
    }
}
