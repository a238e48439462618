//! Small types every Sluice crate shares, in one bounded place.
//!
//! # What belongs here
//!
//! Only these, each a few dozen lines with no Sluice dependency:
//!
//! * [`byte_size`]: byte counts in every role's config (`"64 KiB"` or an
//!   integer), read and written one way.
//! * [`secret`]: [`Secret`], a string from a config that `Debug` never shows.
//! * [`clock`]: [`clock::wall_clock_ms`], the one reading of the wall clock
//!   as milliseconds since the Unix epoch.
//!
//! Anything else (transport, metadata, S3) lives in the crate of its
//! concern; a new module here needs a reason every role shares.

pub mod byte_size;
pub mod clock;
pub mod secret;

pub use secret::Secret;
