//! A dedicated server whose wall clock the test steps while it runs
//! (libfaketime), on the default binaries (PostgreSQL 15).

mod common;

use tollgate_pg_harness::{HarnessError, PgServer};

#[tokio::test]
async fn faketime_server_clock_steps_while_running_and_across_restart() {
    let mut server = PgServer::start_dedicated_faketime().expect("start faketime server");
    assert_eq!(server.binaries().major_version().unwrap(), 15);
    common::check_clock_steps(&mut server).await;
}

#[test]
fn plain_server_runs_on_the_real_clock_and_refuses_offsets() {
    let mut server = PgServer::start_dedicated().expect("start dedicated server");
    common::assert_preloaded(&server, false);
    assert_eq!(server.clock_offset_ns(), None);
    let err = server.set_clock_offset_ns(1).unwrap_err();
    assert!(
        matches!(err, HarnessError::ClockNotFaked { port } if port == server.port()),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "PostgreSQL on 127.0.0.1:{} runs on the real clock; start it with \
             PgServer::start_dedicated_faketime to step its clock",
            server.port()
        )
    );
    assert!(!server.dir().join("faketime.rc").exists());
}
