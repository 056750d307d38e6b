//! The `openprogram` command line. Subcommands arrive with their issues (`serve`, `load`,
//! `ctl`, `inspect`: SPEC §6); until then it says so instead of pretending.

use std::process::ExitCode;

fn main() -> ExitCode {
    let subcommand = std::env::args().nth(1);
    match subcommand.as_deref() {
        Some("--version" | "-V") => {
            println!("openprogram {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("openprogram: `{other}` is not available in this build yet (see README.md)");
            ExitCode::from(2)
        }
        None => {
            eprintln!("usage: openprogram <serve|load|ctl|inspect> … (see README.md)");
            ExitCode::from(2)
        }
    }
}
