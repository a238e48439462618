//! Integration tests for Sluice live in `tests/*/main.rs`; this crate has no library code.
