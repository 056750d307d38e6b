//! Conventions checked on every test run: every Rust file opens with a `//!` line saying
//! what it owns, and no placeholder (`todo!`, `unimplemented!`, `dbg!`) or ignored test is
//! left in the code.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

fn workspace_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "actors", "storage", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 10, "tidy found too few files: {files:?}");
    files
}

#[test]
fn tidy_every_file_opens_with_a_module_doc() {
    let missing: Vec<_> = workspace_files()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            !text.starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading //! line: {missing:?}"
    );
}

#[test]
fn tidy_no_placeholders_or_ignored_tests() {
    // Built from pieces so this file does not match itself.
    let forbidden = [
        concat!("todo", "!("),
        concat!("unimplemented", "!("),
        concat!("dbg", "!("),
        // A test ignored without saying what it needs and how to run it.
        concat!("#[", "ignore]"),
        concat!("#[", "ignore = \"\"]"),
    ];
    let mut hits = Vec::new();
    for path in workspace_files() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            // An ignored test says what it needs: `#[ignore = "needs …: how to run it"]`.
            let ignored = concat!("#[", "ignore = \"");
            let unexplained =
                line.contains(ignored) && !line.contains(concat!("ignore = \"", "needs "));
            if unexplained || forbidden.iter().any(|pattern| line.contains(pattern)) {
                hits.push(format!(
                    "{}:{}: {}",
                    path.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "placeholders left in the code:\n{}",
        hits.join("\n")
    );
}
