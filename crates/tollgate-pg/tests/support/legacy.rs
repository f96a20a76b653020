//! Legacy (pre-0017) SQL.
