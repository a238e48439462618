//! `sluice-chaos`: see the crate docs and chaos/README.md.

fn main() {}
