//! The control plane's default port, the one number `little-compute
//! serve`, `little-compute appliance up` and `lc` agree on. Both binaries
//! include this file.

/// The port as a literal, so the addresses below are built from it at
/// compile time.
macro_rules! control_plane_port {
    () => {
        7480
    };
}

/// The control plane's default port: where `serve` listens without
/// `--listen`, where `appliance up` puts it at its first start, and where
/// `lc` looks without `--server`, `LC_SERVER` or `--data-dir`.
#[allow(dead_code)] // `lc` uses only the URL
pub const DEFAULT_CONTROL_PLANE_PORT: u16 = control_plane_port!();

/// `serve`'s default listen address: loopback only (exposing the control
/// plane beyond the host is an explicit choice).
#[allow(dead_code)] // `lc` uses only the URL
pub const DEFAULT_CONTROL_PLANE_LISTEN: &str = concat!("127.0.0.1:", control_plane_port!());

/// `lc`'s default server.
#[allow(dead_code)] // the service binary uses only the port and address
pub const DEFAULT_CONTROL_PLANE_URL: &str = concat!("http://127.0.0.1:", control_plane_port!());
