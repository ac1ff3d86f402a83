//! The dataset trait, re-exported at the crate root: [`Dataset`].

use crate::dataset::Problem;
use crate::error::Result;

/// An indexed collection of problems.
pub trait Dataset: Send + Sync {
    /// Number of problems.
    fn len(&self) -> usize;
    /// Whether there are no problems.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The problem at `index` (`0..len()`).
    fn get(&self, index: usize) -> Result<Problem>;
}
