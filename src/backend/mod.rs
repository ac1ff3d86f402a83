//! Policy backends: where sampling and training happen.
//!
//! A [`PolicyBackend`] owns trainable weights (a LoRA adapter over a base model) and runs
//! `forward_backward` / `optim_step` in submission order; a [`Sampler`] samples from a frozen
//! snapshot of those weights. Two implementations ship: `tinker` (remote, feature `tinker`)
//! and `local` (candle, feature `local`).

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;

use futures::future::BoxFuture;

use crate::error::Result;

pub(crate) mod api;
#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "tinker")]
pub mod tinker;

pub(crate) use api::{PolicyBackend, Sampler};

tokio::task_local! {
    /// Set while [`crate::loss::forward_backward_custom`] runs its two passes, so that a
    /// remote backend reports them as the SDK does (Tinker: `X-SDK-Method:
    /// TrainingClient.forward_backward_custom` on both passes and their polls).
    pub(crate) static IN_CUSTOM_LOSS: ();
}

/// The result of an operation that was submitted and will complete later.
///
/// Backends return a `Pending` once the operation is *accepted* (queued in order); awaiting it
/// waits for the result. This is what lets a trainer submit `optim_step` before the gradients
/// of `forward_backward` are back.
///
/// ```
/// # tokio_test_block(async {
/// use rlvr::backend::Pending;
/// let p = Pending::new(async { Ok(41 + 1) });
/// assert_eq!(p.await.unwrap(), 42);
/// # });
/// # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub struct Pending<T> {
    fut: BoxFuture<'static, Result<T>>,
}

impl<T> Pending<T> {
    /// Wraps a future.
    pub fn new(fut: impl Future<Output = Result<T>> + Send + 'static) -> Self {
        Pending { fut: Box::pin(fut) }
    }
    /// An already-available result.
    pub fn ready(value: Result<T>) -> Self
    where
        T: Send + 'static,
    {
        Pending::new(futures::future::ready(value))
    }
}

impl<T> fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pending { .. }")
    }
}

impl<T: 'static> IntoFuture for Pending<T> {
    type Output = Result<T>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<T>> + Send>>;
    fn into_future(self) -> Self::IntoFuture {
        self.fut
    }
}
