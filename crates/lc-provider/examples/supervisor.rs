//! The `lc-supervisor` program built as an example of this package, so the
//! provider's tests have a supervisor binary to bind into their instances
//! (`cargo test` builds examples; a package's tests cannot name another
//! package's binaries).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match lc_supervisor::Args::parse(&args) {
        Ok(a) => lc_supervisor::run(a),
        Err(e) => {
            eprintln!("{e}");
            2
        }
    };
    std::process::exit(code);
}
