//! Sluice meta role (under construction).
pub mod client;
pub use client::{MetaClient, MetaError};
