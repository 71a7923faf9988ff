//! The `caracal` command, built as a binary of this package so the suites can run it as a
//! process (`env!("CARGO_BIN_EXE_caracal-command")`): cargo builds a package's own binaries
//! before its integration tests, never another package's. It is the same program as
//! caracal-cli's `caracal`, whose `main` is this line too.

fn main() -> std::process::ExitCode {
    caracal_cli::run(std::env::args_os())
}
