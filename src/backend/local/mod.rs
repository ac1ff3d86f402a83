//! Embedded local backend (candle).
