//! lc-supervisor: the first process of a Little Compute sandbox instance
//! (see the library docs for the design).

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
