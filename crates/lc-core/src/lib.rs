//! Little Compute's domain: the pure rules every Little Compute process
//! applies. No I/O, no clock, no runtime, no database, no HTTP.

pub mod evidence;
pub mod manifest;
pub mod page;
