//! What every Sluice crate shares, in one bounded place.
//!
//! # What belongs here
//!
//! Only these, none with a Sluice dependency:
//!
//! * [`byte_size`]: byte counts in every role's config (`"64 KiB"` or an
//!   integer), read and written one way.
//! * [`secret`]: [`Secret`], a string from a config that `Debug` never shows.
//! * [`clock`]: [`clock::wall_clock_ms`], the one reading of the wall clock
//!   as milliseconds since the Unix epoch.
//! * [`worker`]: [`worker::Workers`], the registry every background loop
//!   runs under (name, run until cancelled, status), as Garage's
//!   `util/background/worker.rs`.
//!
//! Anything else (transport, metadata, S3) lives in the crate of its
//! concern; a new module here needs a reason every role shares.

pub mod byte_size;
pub mod clock;
pub mod secret;
pub mod worker;

pub use secret::Secret;
