//! `caracal`: see and steer a fleet's bulkheads, circuit breakers and rate limits. Everything
//! is in the `caracal_cli` library, so the integration suites can build the same command.

fn main() -> std::process::ExitCode {
    caracal_cli::run(std::env::args_os())
}
