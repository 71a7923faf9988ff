//! The scripts that are no kernel's: the permission check, the registry, the fleet overrides,
//! the operator records and the state reads. A kernel's script is its own (see [`Scripted`](crate::kernel::Scripted)).

use crate::kernel::Script;

macro_rules! scripts {
    ($($static:ident => $file:literal $(after $prelude:literal)?),* $(,)?) => {
        $(
            pub(crate) static $static: Script = Script::new(
                $file,
                &[
                    $(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $prelude, ".lua")),)?
                    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file, ".lua")),
                ],
            );
        )*
    };
}

scripts! {
    ACL_CHECK => "acl_check",
    // The layout of an identity's entry, shared by the three scripts that read or write it.
    REGISTRY_REPORT => "registry_report" after "registry_prelude",
    REGISTRY_READ => "registry_read" after "registry_prelude",
    REGISTRY_HOLD => "registry_hold" after "registry_prelude",
    PROCESSES_READ => "processes_read",
    OVERRIDES_WRITE => "overrides_write",
    OVERRIDES_READ => "overrides_read",
    OPERATORS_READ => "operators_read",
    OPERATOR_WRITE => "operator_write",
    DOCTOR_PROBE => "doctor_probe",
    DOCTOR_WRITE => "doctor_write",
}

#[cfg(test)]
mod tests {
    /// Every script in the package, wherever it lives: `lua/` and the source tree.
    fn every_script() -> Vec<(std::path::PathBuf, String)> {
        fn walk(dir: &std::path::Path, found: &mut Vec<(std::path::PathBuf, String)>) {
            for entry in std::fs::read_dir(dir).expect("readable source tree") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|ext| ext == "lua")
                    // A prelude is no script: its header says what it gives the scripts after it.
                    && !path.file_stem().is_some_and(|stem| stem.to_string_lossy().ends_with("prelude"))
                {
                    let text = std::fs::read_to_string(&path).expect("a readable script");
                    found.push((path, text));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut found = Vec::new();
        walk(&root.join("lua"), &mut found);
        walk(&root.join("src"), &mut found);
        found
    }

    #[test]
    fn every_script_opens_with_its_header() {
        let scripts = every_script();
        assert!(scripts.len() >= 12, "{} scripts found", scripts.len());
        for (path, body) in scripts {
            let header: Vec<_> = body.lines().take_while(|l| l.starts_with("--")).collect();
            let header = header.join("\n");
            for field in ["KEYS", "ARGV", "Reply", "TTL", "Cost"] {
                assert!(
                    header.contains(field),
                    "{} header lacks {field}",
                    path.display()
                );
            }
        }
    }
}
