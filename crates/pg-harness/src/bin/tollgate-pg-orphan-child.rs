//! Child process of the `orphans` test: starts the shared cluster and a
//! dedicated server from short-lived threads, reports their postmasters on
//! stdout, then waits to be SIGKILLed. Not a tool for users.

use std::path::Path;
use std::time::Duration;

use tollgate_pg_harness::{PgCluster, PgServer};

const READY_MARK: &str = "TOLLGATE_CHILD_READY";

fn main() {
    // Start both from threads that end at once: pdeathsig must be tied to
    // the launcher thread, not to these.
    let shared_pid = std::thread::spawn(|| postmaster_pid_of(&PgCluster::shared().log_path()))
        .join()
        .unwrap();
    let dedicated = std::thread::spawn(|| PgServer::start_dedicated().unwrap())
        .join()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Both must still be accepting connections after their threads ended.
    for port in [PgCluster::shared().port(), dedicated.port()] {
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("server died with its thread");
    }
    println!(
        "{READY_MARK} {} {} {} {}",
        shared_pid,
        PgCluster::shared().log_path().parent().unwrap().display(),
        dedicated.pid().unwrap(),
        dedicated.dir().display()
    );
    std::thread::sleep(Duration::from_secs(300));
    panic!("was not killed");
}

fn postmaster_pid_of(log_path: &Path) -> u32 {
    let pid_file = log_path
        .parent()
        .unwrap()
        .join("data")
        .join("postmaster.pid");
    let text = std::fs::read_to_string(pid_file).unwrap();
    text.lines().next().unwrap().trim().parse().unwrap()
}
