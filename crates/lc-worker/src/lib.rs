//! Little Compute's workers: the reconciler (allocate, renew, pump output, destroy, prove, release) as a loop around one step().
