//! A SIGKILLed test binary must not leave PostgreSQL running, and its temp
//! directory must be swept by the next harness user.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tollgate_pg_harness::{PgCluster, PgServer, sweep_stale_dirs};

const CHILD_ENV: &str = "TOLLGATE_PG_HARNESS_ORPHAN_CHILD";
const READY_MARK: &str = "TOLLGATE_CHILD_READY";

/// Run only as a child process by `killed_test_binary_leaves_no_postgres`:
/// starts the shared cluster and a dedicated server from short-lived
/// threads, reports their postmasters, then waits to be killed.
#[test]
#[ignore = "helper: spawned by killed_test_binary_leaves_no_postgres"]
fn orphan_child_entry_point() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
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

fn alive(pid: u32) -> bool {
    // A zombie has no cmdline; a reaped process has no /proc entry.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        if entry
            .file_name()
            .to_str()
            .is_none_or(|n| !n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{}: {cmd}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn killed_test_binary_leaves_no_postgres() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "orphan_child_entry_point",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix(READY_MARK) {
                let _ = tx.send(rest.trim().to_owned());
                return;
            }
        }
    });
    let report = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(report) => report,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child never reported its servers: {e}");
        }
    };
    let parts: Vec<&str> = report.split(' ').collect();
    assert_eq!(parts.len(), 4, "{report}");
    let pids = [
        parts[0].parse::<u32>().unwrap(),
        parts[2].parse::<u32>().unwrap(),
    ];
    let dirs = [PathBuf::from(parts[1]), PathBuf::from(parts[3])];
    for (pid, dir) in pids.iter().zip(&dirs) {
        assert!(alive(*pid), "postmaster {pid} not running before the kill");
        assert!(dir.is_dir());
    }

    child.kill().unwrap(); // SIGKILL: no destructors, no atexit
    child.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<String> = dirs
            .iter()
            .flat_map(|d| processes_mentioning(&d.display().to_string()))
            .collect();
        if pids.iter().all(|p| !alive(*p)) && left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running after the kill: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Backends (whose cmdline does not name the directory) follow their
    // postmaster: wait for the ones of the child's postmasters to go too.
    let children_left = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                    let after = s.rsplit(')').next().unwrap_or("");
                    let ppid = after
                        .split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u32>().ok());
                    ppid.is_some_and(|pp| pids.contains(&pp))
                })
            })
            .collect()
    };
    while !children_left().is_empty() {
        assert!(
            Instant::now() < deadline,
            "backends left: {:?}",
            children_left()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The directories stay behind until a sweep removes them.
    assert!(dirs.iter().all(|d| d.is_dir()));
    assert!(sweep_stale_dirs() >= 2);
    for dir in &dirs {
        assert!(!dir.exists(), "{} was not swept", dir.display());
    }
}
