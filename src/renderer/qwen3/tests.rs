//! Unit tests of the Qwen renderers' helpers (the fixtures in tests/renderers.rs compare
//! whole renders with the cookbook).
