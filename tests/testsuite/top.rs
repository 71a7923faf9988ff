//! `caracal top` as a person runs it: in a real terminal (a tmux session of its own), its
//! screen captured and read, against two worker processes each putting a known load on: 50
//! calls a second to a bulkhead that admits them all, to a rate limit of 10 a second (for
//! the fleet) that turns the rest away, and to its twin in shadow mode, which lets them run and
//! shows them as WOULD_REJECT/s. The rates shown are the fleet's: the two processes'
//! reports summed, which one process alone could not reach.

use std::process::Command;
use std::time::Duration;

use caracal_tests::RedisServer;
use caracal_tests::wait::wait_until;

use crate::cli::command_binary;
use crate::common::unique;
use crate::fleet_ops::Stream;

/// A tmux server of the test's own (its own socket), gone when dropped.
struct Terminal {
    socket: String,
}

impl Terminal {
    /// A 200×50 terminal running `command`.
    fn run(command: &str) -> Self {
        let terminal = Terminal {
            socket: unique("caracal-top"),
        };
        let started = terminal
            .tmux(&["new-session", "-d", "-x", "200", "-y", "50", command])
            .status
            .success();
        assert!(started, "tmux new-session");
        terminal
    }

    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux runs")
    }

    /// What the terminal shows now.
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p"]).stdout).into_owned()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

/// The cells of `name`'s row on `screen` (columns are at least two spaces apart).
fn row(screen: &str, name: &str) -> Option<Vec<String>> {
    screen.lines().find_map(|line| {
        let cells: Vec<String> = line
            .split("  ")
            .map(str::trim)
            .filter(|cell| !cell.is_empty())
            .map(str::to_owned)
            .collect();
        (cells.get(1).map(String::as_str) == Some(name)).then_some(cells)
    })
}

fn rate(cell: &str) -> f64 {
    cell.parse().unwrap_or(f64::NAN)
}

#[test]
fn top_shows_the_fleets_rates_against_the_load_in_a_terminal() {
    let server = RedisServer::start();
    let (url, namespace, scope) = (server.url(), unique("top"), unique("scope"));
    let mut workers: Vec<Stream> = (0..2)
        .map(|_| Stream::spawn(&url, &namespace, "top-load", &[format!("scope={scope}")]))
        .collect();
    for worker in &mut workers {
        worker.until("the load", |w| w.has_line("using"));
    }
    let command = format!(
        "{} --url {url} --namespace {namespace} top --interval 500ms",
        command_binary()
    );
    let terminal = Terminal::run(&command);
    // Each process reports its rates every 5 s, over the time since its report before: the
    // first (a moment after its first call) covers a few calls only.
    let mut screen = String::new();
    let mut seen = (Vec::new(), Vec::new(), Vec::new());
    wait_until(
        Duration::from_secs(60),
        "top to show the load's rates",
        || {
            screen = terminal.screen();
            let (Some(load), Some(limited), Some(shadow)) = (
                row(&screen, "top-load"),
                row(&screen, "top-limited"),
                row(&screen, "top-shadow"),
            ) else {
                return false;
            };
            seen = (load.clone(), limited.clone(), shadow.clone());
            // KIND NAME SCOPE ADMITTED/s REJECTED/s WHY IN FLIGHT STATE FAILURES WOULD_REJECT/s
            // Two processes at 50 calls a second each: one process's report alone shows at
            // most 50 calls a second (admitted or rejected), so these ranges hold only for the sum.
            let all_admitted = (60.0..=130.0).contains(&rate(&load[3])) && rate(&load[4]) == 0.0;
            let capped = (5.0..=13.0).contains(&rate(&limited[3]))
                && (60.0..=100.0).contains(&rate(&limited[4]))
                && limited[5].starts_with("rate_exceeded ");
            // The shadow twin refuses nothing; what it would refuse has its own column.
            let would_reject = shadow.last().and_then(|cell| {
                let rate = cell.strip_prefix("rate_exceeded ")?;
                rate.parse::<f64>().ok()
            });
            let shadowed = (5.0..=13.0).contains(&rate(&shadow[3]))
                && rate(&shadow[4]) == 0.0
                && would_reject.is_some_and(|r| (60.0..=100.0).contains(&r));
            all_admitted && capped && shadowed
        },
    );
    println!("caracal top in tmux:\n{screen}");
    let (load, limited, shadow) = seen;
    assert!(
        screen.starts_with(&format!("caracal top: namespace `{namespace}`")),
        "{screen}"
    );
    assert_eq!(load[0], "bulkhead", "{load:?}");
    assert_eq!(load[2], scope, "{load:?}");
    assert!(
        load[6].ends_with("/1000"),
        "in flight of its limit: {load:?}"
    );
    assert_eq!(limited[0], "rate_limit", "{limited:?}");
    assert_eq!(limited[7], "10/s", "{limited:?}");
    assert_eq!(limited[8], "-", "{limited:?}");
    assert_eq!(limited[9], "-", "nothing shadowed: {limited:?}");
    assert_eq!(shadow[0], "rate_limit", "{shadow:?}");
    drop(terminal);

    // `--json`: a line of `status --json` per identity, with the rates, per redraw.
    let mut json = std::process::Command::new(command_binary())
        .args(["--url", &url, "--namespace", &namespace, "--json"])
        .args(["top", "--interval", "100ms"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the command runs");
    let stdout = json.stdout.take().expect("its stdout");
    let lines: Vec<serde_json::Value> = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .take(2)
        .map(|line| serde_json::from_str(&line.expect("a line")).expect("a JSON line"))
        .collect();
    let _ = json.kill();
    let _ = json.wait();
    let limited = lines
        .iter()
        .find(|line| line["name"] == "top-limited")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(limited["kind"], "rate_limit", "{limited}");
    assert!(
        limited["rates"]["admitted"].as_f64() > Some(0.0),
        "{limited}"
    );
    assert!(
        limited["rates"]["rejected"]["rate_exceeded"].as_f64() > Some(0.0),
        "{limited}"
    );
}
