//! Embedded local backend (candle).

pub(crate) mod loss;
pub(crate) mod optim;
