//! A streaming-replication pair on the default binaries (PostgreSQL 15).

mod common;

use tollgate_pg_harness::PgPair;

#[tokio::test]
async fn standby_replays_refuses_writes_and_promotes_to_the_next_timeline() {
    let mut pair = PgPair::start().expect("start replication pair");
    common::check_pair(&mut pair, 15).await;
}
