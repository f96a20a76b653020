//! `lc`: the Little Compute client.

fn main() {}
