//! The `little-compute` binary: serve, provider, worker, appliance.

fn main() {}
