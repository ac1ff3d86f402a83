//! The reward trait, re-exported at the crate root: [`RewardFn`], and its implementation
//! for plain closures.

use async_trait::async_trait;

use crate::dataset::Problem;
use crate::reward::{Response, Reward, RewardError};

/// Grades one response to one problem.
#[async_trait]
pub trait RewardFn: Send + Sync + 'static {
    /// The reward of `response` for `problem`.
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError>;
}

#[async_trait]
impl<F> RewardFn for F
where
    F: Fn(&Problem, &str) -> f64 + Send + Sync + 'static,
{
    async fn grade(&self, problem: &Problem, response: &Response) -> Result<Reward, RewardError> {
        Ok(Reward::new(self(problem, &response.text)))
    }
}
