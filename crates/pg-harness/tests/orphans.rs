//! A SIGKILLed test binary must not leave PostgreSQL running, and its temp
//! directory must be swept by the next harness user.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tollgate_pg_harness::sweep_stale_dirs;

const READY_MARK: &str = "TOLLGATE_CHILD_READY";

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
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-pg-orphan-child"))
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
