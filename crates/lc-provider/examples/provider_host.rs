//! A process that hosts a [`BwrapProvider`], for the tests of what happens
//! to instances when their provider is killed: it opens the provider on
//! `STATE_DIR` with parent cgroup `CGROUP_PARENT`, allocates lease 1
//! generation 1 running `sleep 300`, prints `ready` and waits forever.
//!
//! `provider_host STATE_DIR CGROUP_PARENT SUPERVISOR`

use lc_core::shape::SMALL;
use lc_core::{AttemptNo, Command, ExecId, Generation, ProviderId, SandboxLeaseId, WorkspaceId};
use lc_provider::runtime::base_digest;
use lc_provider::{AllocateRequest, BwrapConfig, BwrapProvider, Provider};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [state, parent, supervisor] = args.as_slice() else {
        eprintln!("usage: provider_host STATE_DIR CGROUP_PARENT SUPERVISOR");
        std::process::exit(2);
    };
    let mut cfg = BwrapConfig::new(
        ProviderId::new("p-test").unwrap(),
        std::path::Path::new(state),
        std::path::Path::new(supervisor),
    );
    cfg.cgroup_parent = parent.clone();
    let provider = BwrapProvider::open(cfg).unwrap();
    provider
        .allocate(AllocateRequest {
            lease_id: SandboxLeaseId(1),
            generation: Generation(1),
            exec_id: ExecId(1),
            attempt: AttemptNo(1),
            runtime: base_digest(),
            shape: SMALL,
            command: Command::new(vec!["sleep".into(), "300".into()]).unwrap(),
            workspace_id: WorkspaceId(1),
            stdin_open: false,
            first_seq: 1,
            first_input_seq: 1,
            restore: None,
        })
        .await
        .unwrap();
    println!("ready");
    std::future::pending::<()>().await;
}
