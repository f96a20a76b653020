//! Little Compute's PostgreSQL store: its migration line and persistence, composing Tollgate's operations in one transaction.
