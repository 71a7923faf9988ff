//! The layering rules, checked on the source: what each layer must never import. A rule broken
//! by a new `use` fails here, naming the file and line, before it can turn the layers into a
//! tangle.
//!
//! - the kernels (`kernel/`, the trait, and each kind's `policy/<kind>/…/kernel/`) → nothing
//!   that does I/O or tells time: no tokio, no redis, no clock, no coordinator, no policy code
//!   (a kind's kernel is the bottom of its folder);
//! - `coordinator` → no policy, not even a kind's kernel (the coordinator is kind-blind: a kind
//!   reaches it through the generic seams — `run::<K>`, `kept::<T>()`, feed listeners — so every
//!   file of a kind sits above it, in the kind's folder);
//! - `policy` → not the Redis backend (policies never know which backend answers);
//! - the backends → not the macros, and not their owner (`coordinator/mod.rs`), neither its
//!   types nor its functions: what they share with it lives below both
//!   (`coordinator/protocol.rs`, the kernels, `token.rs`);
//! - a kind's files (its policy folder, its kernel) → no other kind's;
//! - the bottom floor (the labels, identities, tallies, operators, tokens, errors, priorities,
//!   clock and summaries that every layer reads) → neither the events nor the metrics above it,
//!   nor the coordinator or a policy;
//! - the telemetry every kind shares (`events.rs`, `metrics.rs`) → neither the coordinator nor a
//!   policy: a kind's own events and metrics live in its folder;
//! - the tower guard (`guard/`: the one service every layer wraps) → neither the coordinator
//!   nor a policy: each kind's layer sits above it, and `tower.rs` re-exports both on top;
//! - nothing but tests → the crate root's re-exports (`crate::Error`): the root is the public
//!   façade, on top, and a module that imports through it ties every module the root
//!   re-exports from below it.

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
    violations_in(&sources(&src().join(layer)), forbidden, |_| false)
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The lines of `files` that mention any of `forbidden` outside comments, but for those
/// `allowed` lets through.
fn violations_in(
    files: &[PathBuf],
    forbidden: &[&str],
    allowed: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("read source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if let Some(word) = forbidden.iter().find(|word| code.contains(*word))
                && !allowed(code)
            {
                found.push(format!("{}:{}: `{word}`", file.display(), number + 1));
            }
        }
    }
    found
}

/// The kinds: the folders of `policy/`.
fn kinds() -> Vec<String> {
    let kinds: Vec<String> = std::fs::read_dir(src().join("policy"))
        .expect("read policy dir")
        .filter_map(|entry| {
            let path = entry.expect("dir entry").path();
            path.is_dir().then(|| {
                path.file_name()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned()
            })
        })
        .collect();
    assert!(kinds.len() >= 3, "kinds found: {kinds:?}");
    kinds
}

#[test]
fn the_kernels_import_no_clock_io_or_upper_layer() {
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
    let mut files = sources(&src().join("kernel"));
    // A kind's kernels, also those of a part of a kind (`policy/hedge/latency/kernel/`).
    let in_a_kernel = |file: &PathBuf| {
        let under_policy = file
            .strip_prefix(src().join("policy"))
            .expect("under policy");
        under_policy
            .components()
            .any(|part| part.as_os_str() == "kernel")
    };
    files.extend(
        sources(&src().join("policy"))
            .into_iter()
            .filter(in_a_kernel),
    );
    assert!(files.len() >= 5, "{files:?}");
    assert_eq!(
        violations_in(&files, &forbidden, |_| false),
        Vec::<String>::new()
    );
}

#[test]
fn the_coordinator_knows_no_kind() {
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

/// The lines of `file` (under `src/`) that use items of the module `owner` names directly
/// (`owner::{…}`, `owner::Item`, `owner::function()`) rather than one of its submodules, whose
/// names `submodules` holds.
fn owner_items(file: &Path, owner: &str, submodules: &[String]) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("read source");
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let direct = code.match_indices(owner).any(|(at, _)| {
            let rest = &code[at + owner.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            rest.starts_with('{') || (!name.is_empty() && !submodules.contains(&name))
        });
        if direct {
            found.push(format!("{}:{}", file.display(), number + 1));
        }
    }
    found
}

/// The modules of the folder `dir`: its files' and subfolders' names.
fn submodules(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            let path = entry.expect("dir entry").path();
            let name = path.file_stem().expect("a name").to_string_lossy();
            name.into_owned()
        })
        .collect()
}

#[test]
fn backends_never_import_their_owner() {
    let coordinator = src().join("coordinator");
    let modules = submodules(&coordinator);
    let mut found = owner_items(&coordinator.join("memory.rs"), "super::", &modules);
    found.extend(owner_items(
        &coordinator.join("redis/mod.rs"),
        "super::",
        &modules,
    ));
    for file in sources(&coordinator.join("redis")) {
        found.extend(owner_items(&file, "crate::coordinator::", &modules));
        found.extend(owner_items(&file, "super::super::", &modules));
    }
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn the_bottom_floor_imports_nothing_above_it() {
    let files: Vec<PathBuf> = [
        "labels.rs",
        "identity.rs",
        "tally.rs",
        "operator.rs",
        "token.rs",
        "error.rs",
        "clock.rs",
        "summary.rs",
        "sync.rs",
        "script.rs",
        "fencing.rs",
    ]
    .iter()
    .map(|file| src().join(file))
    .collect();
    let above = [
        "crate::events",
        "crate::metrics",
        "crate::coordinator",
        "crate::policy",
        "crate::config",
    ];
    assert_eq!(
        violations_in(&files, &above, |_| false),
        Vec::<String>::new()
    );
}

#[test]
fn the_shared_telemetry_knows_no_kind_and_no_coordinator() {
    let files = [src().join("events.rs"), src().join("metrics.rs")];
    assert_eq!(
        violations_in(&files, &["crate::coordinator", "crate::policy"], |_| false),
        Vec::<String>::new()
    );
}

#[test]
fn the_tower_guard_knows_no_kind_and_no_coordinator() {
    let files: Vec<PathBuf> = sources(&src().join("guard"))
        .into_iter()
        .filter(|file| file.file_name().is_some_and(|name| name != "tests.rs"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    assert_eq!(
        violations_in(&files, &["crate::coordinator", "crate::policy"], |_| false),
        Vec::<String>::new()
    );
}

/// The kinds built on another by design: a hedge's extra attempts withdraw from a retry
/// budget, so that hedges and retries share one fleet-wide budget (issue 34).
const BUILT_ON: &[(&str, &str)] = &[("hedge", "retry_budget")];

#[test]
fn a_kinds_files_import_no_other_kinds() {
    let kinds = kinds();
    let mut found = Vec::new();
    for kind in &kinds {
        let others: Vec<String> = kinds
            .iter()
            .filter(|other| *other != kind && !BUILT_ON.contains(&(kind.as_str(), other.as_str())))
            .flat_map(|other| [format!("policy::{other}"), format!("kernel::{other}")])
            .collect();
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        found.extend(violations(&format!("policy/{kind}"), &others));
    }
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn nothing_imports_through_the_crate_root() {
    let mut found = Vec::new();
    for file in sources(&src()) {
        let name = file.file_name().expect("a name");
        if name == "lib.rs"
            || name == "tests.rs"
            || file.components().any(|c| c.as_os_str() == "tests")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let through_root = code.match_indices("crate::").any(|(at, _)| {
                let rest = &code[at + "crate::".len()..];
                let before = code[..at].chars().next_back();
                // `caracal::` in doc text is not code, and `$crate::` is a macro's own path.
                before != Some('$')
                    && (rest.starts_with('{') || rest.starts_with(|c: char| c.is_uppercase()))
            });
            if through_root && !code.trim_start().starts_with("#[doc") {
                found.push(format!("{}:{}", file.display(), number + 1));
            }
        }
    }
    assert_eq!(found, Vec::<String>::new());
}
