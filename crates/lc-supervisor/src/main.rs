//! lc-supervisor: PID 1 inside a Little Compute sandbox instance.

fn main() {}
