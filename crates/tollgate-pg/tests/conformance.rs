//! The conformance suite (the identical tests the MemoryStore runs) against
//! `PostgresStore` on a real PostgreSQL: a fresh, migrated database per test.

mod support;

tollgate::conformance_tests!(support::PgFactory);
