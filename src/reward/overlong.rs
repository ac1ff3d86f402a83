//! DAPO's soft overlong punishment as a reward wrapper.

use async_trait::async_trait;

use crate::dataset::Problem;
use crate::error::{Error, Result};
use crate::reward::{Response, Reward, RewardError, RewardFn};

/// DAPO's soft overlong punishment (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement
/// Learning System at Scale", eq. 13) added to another reward: a response of `n` sampled
/// tokens gets
///
/// ```text
///   0                                   if n ≤ L_max − L_cache
///   factor · ((L_max − L_cache) − n) / L_cache   if L_max − L_cache < n ≤ L_max
///   −factor                             if n > L_max
/// ```
///
/// on top of the inner reward's total (and a component `overlong_penalty`), so that a
/// response is punished more the further it runs into the last `L_cache` tokens of the
/// budget `L_max` (usually the sampling `max_tokens`) instead of all at once at the cut.
/// `factor` is 1 in the paper (verl's `overlong_buffer.penalty_factor`). Up to `L_max` this
/// is verl's `min(−exceed / L_cache · factor, 0)`; beyond it, the paper's −1 (verl's line
/// goes on falling, which only matters when `L_max` is below the sampling budget).
///
/// ```
/// use rlvr::reward::OverlongPenalty;
/// let exact = |p: &rlvr::dataset::Problem, t: &str| if t == p.answer { 1.0 } else { 0.0 };
/// let reward = OverlongPenalty::new(exact, 100, 20)?;
/// assert_eq!(reward.penalty(80), 0.0);
/// assert_eq!(reward.penalty(90), -0.5);
/// assert_eq!(reward.penalty(100), -1.0);
/// assert_eq!(reward.penalty(150), -1.0);
/// # Ok::<(), rlvr::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct OverlongPenalty<R> {
    inner: R,
    max_tokens: usize,
    cache: usize,
    factor: f64,
}

impl<R> OverlongPenalty<R> {
    /// `inner` with the punishment over the last `cache` tokens of `max_tokens` (`L_max`,
    /// `L_cache`), factor 1.
    ///
    /// Errors: [`Error::Config`] when `cache` is 0 or larger than `max_tokens`.
    pub fn new(inner: R, max_tokens: usize, cache: usize) -> Result<Self> {
        if cache == 0 || cache > max_tokens {
            return Err(Error::config(
                "overlong cache",
                format!("must be in 1..={max_tokens} (max_tokens), got {cache}"),
            ));
        }
        Ok(OverlongPenalty {
            inner,
            max_tokens,
            cache,
            factor: 1.0,
        })
    }

    /// Scales the punishment (builder style; DAPO uses 1).
    ///
    /// Errors: [`Error::Config`] for a negative or non-finite factor.
    pub fn with_factor(mut self, factor: f64) -> Result<Self> {
        if !factor.is_finite() || factor < 0.0 {
            return Err(Error::config(
                "overlong penalty factor",
                format!("must be finite and ≥ 0, got {factor}"),
            ));
        }
        self.factor = factor;
        Ok(self)
    }

    /// The punishment of a response of `tokens` sampled tokens (≤ 0).
    pub fn penalty(&self, tokens: usize) -> f64 {
        let expected = self.max_tokens - self.cache;
        if tokens <= expected {
            0.0
        } else if tokens <= self.max_tokens {
            -((tokens - expected) as f64) / self.cache as f64 * self.factor
        } else {
            -self.factor
        }
    }
}

#[async_trait]
impl<R: RewardFn> RewardFn for OverlongPenalty<R> {
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError> {
        let mut reward = self.inner.grade(problem, response).await?;
        let p = self.penalty(response.tokens.len());
        reward.total += p;
        reward.components.insert("overlong_penalty".into(), p);
        Ok(reward)
    }
}
