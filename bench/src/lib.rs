//! Shared helpers of the Tollgate benchmarks.
