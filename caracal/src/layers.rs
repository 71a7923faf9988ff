//! The layering rules, checked on the source: what each layer must never import. A rule broken
//! by a new `use` fails here, naming the file and line, before it can turn the layers into a
//! tangle.
//!
//! - `kernel` → nothing that does I/O or tells time: no tokio, no redis, no clock, no
//!   coordinator, no policy;
//! - `coordinator` → no policy;
//! - `policy` → not the Redis backend (policies never know which backend answers);
//! - the backends → not the macros.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read source dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The lines of the files under `src/<layer>` that mention any of `forbidden`, outside
/// comments.
fn violations(layer: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(layer);
    let mut found = Vec::new();
    for file in sources(&root) {
        let text = std::fs::read_to_string(&file).expect("read source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if let Some(word) = forbidden.iter().find(|word| code.contains(*word)) {
                found.push(format!("{}:{}: `{word}`", file.display(), number + 1));
            }
        }
    }
    found
}

#[test]
fn the_kernel_imports_no_clock_io_or_upper_layer() {
    let forbidden = [
        "tokio",
        "redis",
        "crate::clock",
        "crate::coordinator",
        "crate::policy",
        "std::time",
        "Instant",
        "rand::",
    ];
    assert_eq!(violations("kernel", &forbidden), Vec::<String>::new());
}

#[test]
fn the_coordinator_never_imports_a_policy() {
    assert_eq!(
        violations("coordinator", &["crate::policy", "policy::"]),
        Vec::<String>::new()
    );
}

#[test]
fn policies_never_reach_the_redis_backend() {
    assert_eq!(
        violations("policy", &["coordinator::redis", "redis::"]),
        Vec::<String>::new()
    );
}

#[test]
fn backends_never_reach_the_macros() {
    assert_eq!(
        violations("coordinator", &["caracal_macros", "__private"]),
        Vec::<String>::new()
    );
}
