//! The test bed's process: `silvic-testbed rank key=value...` or `silvic-testbed relay ...`.
//! See the `rank` and `relay` modules of the library for what each prints and reads.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("rank") => silvic_testbed::rank::main(&args[1..]),
        Some("relay") => silvic_testbed::relay::main(&args[1..]),
        _ => {
            eprintln!("usage: silvic-testbed rank key=value... | relay delay_ms=N jitter_ms=N");
            64
        }
    };
    std::process::exit(code);
}
