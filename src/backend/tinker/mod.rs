//! Tinker backend (remote training over the Tinker HTTP API).
