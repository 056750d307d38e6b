//! The architecture's import rules, read from the source as `tidy` reads headers (issue 30):
//! no import cycle between the files of a package, the embedder's plug-in module reaches no
//! actor, and nothing in `src/http/` (the API, the
//! debug endpoint, the CLI's client) that could write to the store — it reads through
//! `Runtime::inspect` and `Runtime::store`, which are read-only, and acts only through the
//! command service. (That packages depend `openprogram → openprogram-actors →
//! openprogram-storage`, never back, cargo itself enforces.)
//!
//! A `use` line, or a `crate::…` path written in the code, names a module path; it is
//! resolved to the file of the longest module prefix that exists (`crate::`, `super::`, `self::`, or a child module of the file). An
//! item named at the crate root is followed through the root's `pub use` re-exports to the
//! file that defines it; the root's own `mod` and `pub use` lines are declarations, not
//! dependencies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A package's source tree: module path (`execution::machine`, `` for the root) → file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let join = |name: &str| match prefix.is_empty() {
                true => name.to_owned(),
                false => format!("{prefix}::{name}"),
            };
            if path.is_dir() {
                walk(&path, &join(&name), out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let module = match stem {
                    "lib" if prefix.is_empty() => String::new(),
                    "main" if prefix.is_empty() => continue, // another crate (the binary)
                    "mod" => prefix.to_owned(),
                    _ => join(stem),
                };
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, "", &mut out);
    out
}

/// The `use` declarations of a file, each expanded to its full paths (`a::{b, c::d}` →
/// `a::b`, `a::c::d`), with whether it was `pub`.
fn uses(text: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    let mut statement: Option<(bool, String)> = None;
    for raw in text.lines() {
        let line = raw.split("//").next().unwrap_or_default().trim();
        if let Some((public, text)) = statement.as_mut() {
            text.push_str(line);
            if line.ends_with(';') {
                out.push((*public, text.clone()));
                statement = None;
            }
            continue;
        }
        let (public, rest) = match line.strip_prefix("pub ") {
            Some(rest) => (true, rest),
            None => match line.strip_prefix("pub(crate) ") {
                Some(rest) => (true, rest),
                None => (false, line),
            },
        };
        // Only the file's own `use` lines: an indented one belongs to an inline module (a
        // file's tests), whose `super` is the file itself.
        if raw.starts_with(char::is_whitespace) {
            continue;
        }
        if let Some(rest) = rest.strip_prefix("use ") {
            match rest.ends_with(';') {
                true => out.push((public, rest.to_owned())),
                false => statement = Some((public, rest.to_owned())),
            }
        }
    }
    out.into_iter()
        .map(|(public, text)| {
            let text: String = text.trim_end_matches(';').split_whitespace().collect();
            (public, expand(&text))
        })
        .collect()
}

/// The `crate::…` and `super::…` paths a file names outside its `use` lines
/// (`crate::process::Processes` as a field's type, `super::restart::DecideInherited` in a
/// call): dependencies as much as an import. Comments are left out, and so is an inline
/// module's code (indented `mod tests { … }`), whose `super` is the file itself.
fn inline_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(inline_paths_of(text, "crate::"));
    out.extend(inline_paths_of(&outside_inline_modules(text), "super::"));
    out
}

/// `text` without the bodies of its inline modules (`mod name {` at the start of a line, to
/// the `}` that closes it there).
fn outside_inline_modules(text: &str) -> String {
    let mut kept = String::new();
    let mut inside = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let opens = (code.starts_with("mod ") || code.starts_with("pub mod "))
            && code.trim_end().ends_with('{');
        match (inside, opens) {
            (false, true) => inside = true,
            (true, _) => inside = line != "}",
            (false, false) => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    kept
}

/// The paths starting `prefix` (`crate::` or `super::`) a file's code names outside its
/// `use` lines.
fn inline_paths_of(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        if code.trim_start().starts_with("use ") || code.trim_start().starts_with("pub use ") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            let after = &rest[at..];
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(after.len());
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.push(after[..len].trim_end_matches(':').to_owned());
            }
            rest = &after[len.max(1)..];
        }
    }
    out
}

/// `a::{b,c::{d,e}}` → `a::b`, `a::c::d`, `a::c::e` (`x as y` keeps `x`).
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        let path = tree.split("as").next().unwrap_or(tree);
        return vec![path.trim_end_matches("::").to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (index, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|part| !part.is_empty())
        .flat_map(expand)
        .map(|path| match (prefix.is_empty(), path.as_str()) {
            (true, _) => path,
            (false, "self") => prefix.to_owned(),
            (false, _) => format!("{prefix}::{path}"),
        })
        .collect()
}

/// The module a path inside `from` names: the longest prefix that is a module of the
/// package, after `crate`, `super` and `self`; `None` for another crate.
fn target(
    path: &str,
    from: &str,
    modules: &BTreeMap<String, PathBuf>,
) -> Option<(String, Vec<String>)> {
    let mut segments: Vec<&str> = path.split("::").collect();
    let mut base: Vec<String> = match segments.first().copied() {
        Some("crate") => {
            segments.remove(0);
            Vec::new()
        }
        Some("self") => {
            segments.remove(0);
            from.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        }
        Some("super") => {
            let mut base: Vec<String> = from
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            while segments.first() == Some(&"super") {
                segments.remove(0);
                base.pop();
            }
            base
        }
        Some(first) => {
            // A child module of this file, or another crate.
            let child = match from.is_empty() {
                true => (*first).to_owned(),
                false => format!("{from}::{first}"),
            };
            if !modules.contains_key(&child) {
                return None;
            }
            from.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        }
        None => return None,
    };
    let mut module = base.join("::");
    let mut rest = Vec::new();
    for (index, segment) in segments.iter().enumerate() {
        base.push((*segment).to_owned());
        let longer = base.join("::");
        if modules.contains_key(&longer) {
            module = longer;
        } else {
            rest = segments[index..].iter().map(|s| (*s).to_owned()).collect();
            break;
        }
    }
    Some((module, rest))
}

/// Every file's imports of other files of its package.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let read = |module: &str| std::fs::read_to_string(&modules[module]).unwrap_or_default();
    // The root's re-exports: item name → the path it re-exports.
    let mut reexports = BTreeMap::new();
    for (public, paths) in uses(&read("")) {
        // A glob re-export (`pub use ids::*`) names no one item: not followed.
        for path in paths
            .into_iter()
            .filter(|path| public && !path.ends_with('*'))
        {
            if let Some(name) = path.rsplit("::").next() {
                reexports.insert(name.to_owned(), path.clone());
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for module in modules.keys() {
        let imports = edges.entry(module.clone()).or_default();
        if module.is_empty() {
            continue; // the root declares; it does not depend
        }
        let text = read(module);
        let mut paths: Vec<String> = uses(&text)
            .into_iter()
            .flat_map(|(_, paths)| paths)
            .collect();
        paths.extend(inline_paths(&text));
        {
            for path in paths {
                let Some((mut target_module, rest)) = target(&path, module, &modules) else {
                    continue;
                };
                if target_module.is_empty() {
                    // An item at the root: where it is re-exported from.
                    let resolved = rest
                        .first()
                        .and_then(|item| reexports.get(item))
                        .and_then(|path| target(path, "", &modules));
                    match resolved {
                        Some((defined_in, _)) => target_module = defined_in,
                        None => continue, // defined at the root itself, or a macro
                    }
                }
                if &target_module != module && !target_module.is_empty() {
                    imports.insert(target_module);
                }
            }
        }
    }
    edges
}

/// The cycles: strongly connected groups of more than one file (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, node: &'a str) {
            let next = self.index.len();
            self.index.insert(node, next);
            self.low.insert(node, next);
            self.stack.push(node);
            self.on_stack.insert(node);
            for to in self.edges.get(node).into_iter().flatten() {
                let to = to.as_str();
                if !self.index.contains_key(to) {
                    self.visit(to);
                    let low = self.low[node].min(self.low[to]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(to) {
                    let low = self.low[node].min(self.index[to]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut group = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    group.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !tarjan.index.contains_key(node.as_str()) {
            tarjan.visit(node);
        }
    }
    tarjan.found
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_import_cycle_between_the_files_of_a_package() {
    let mut found = Vec::new();
    for src in ["src", "actors/src", "storage/src"] {
        for cycle in cycles(&edges(&root().join(src))) {
            found.push(format!("{src}: {}", cycle.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The checker finds a planted cycle of each kind — `use` lines, `super::` and `crate::` paths
/// in the code — resolves `super::` and follows re-exports.
#[test]
fn the_cycle_check_finds_a_cycle_it_is_shown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir(src.join("a")).expect("dir");
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\npub use b::Thing;\n").expect("lib");
    std::fs::write(src.join("a/mod.rs"), "mod c;\n").expect("a");
    std::fs::write(src.join("a/c.rs"), "use crate::{Thing, a::d};\n").expect("c");
    std::fs::write(src.join("a/d.rs"), "use super::{\n    c::X,\n};\n").expect("d");
    std::fs::write(src.join("b.rs"), "use std::fmt;\npub struct Thing;\n").expect("b");
    // A path in the code is a dependency too; one in a comment is not.
    std::fs::write(
        src.join("e.rs"),
        "// crate::a::c\nfn f(_: crate::b::Thing) {}\n",
    )
    .expect("e");
    // A circle of `super::` paths in the code, and one of `crate::` paths; an inline
    // module's `super::` is its own file (no edge).
    std::fs::create_dir(src.join("h")).expect("dir");
    std::fs::write(src.join("h/mod.rs"), "mod f;\nmod g;\n").expect("h");
    std::fs::write(
        src.join("h/f.rs"),
        "fn x() { super::g::y(); }\npub fn z() {}\n",
    )
    .expect("f");
    std::fs::write(src.join("h/g.rs"), "pub fn y() { super::f::z(); }\n").expect("g");
    std::fs::write(src.join("i.rs"), "pub struct I;\nfn a(_: crate::j::J) {}\n").expect("i");
    std::fs::write(src.join("j.rs"), "pub struct J;\nfn b(_: crate::i::I) {}\n").expect("j");
    std::fs::write(
        src.join("k.rs"),
        "pub fn helper() {}\nmod tests {\n    fn t() { super::helper(); }\n}\n",
    )
    .expect("k");
    let edges = edges(src);
    assert_eq!(edges["e"], BTreeSet::from(["b".to_owned()]));
    assert_eq!(
        edges["a::c"],
        BTreeSet::from(["b".to_owned(), "a::d".to_owned()])
    );
    assert!(edges.get("k").is_none_or(BTreeSet::is_empty), "{edges:?}");
    assert_eq!(
        cycles(&edges),
        vec![
            vec!["a::c".to_owned(), "a::d".to_owned()],
            vec!["h::f".to_owned(), "h::g".to_owned()],
            vec!["i".to_owned(), "j".to_owned()],
        ]
    );
}

/// The embedder's plug-in module (`Provider`, `Tool`, call handles: `agent.rs`) and every
/// file it reaches import no actor: a provider or tool can be written and tested without
/// the runtime's actors.
#[test]
fn the_plug_in_module_reaches_no_actor() {
    let src = root().join("actors/src");
    let edges = edges(&src);
    let modules = modules(&src);
    let mut reached = BTreeSet::from(["agent".to_owned()]);
    let mut stack = vec!["agent".to_owned()];
    while let Some(module) = stack.pop() {
        for next in edges.get(&module).into_iter().flatten() {
            if reached.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    assert!(reached.contains("call"), "the call handles: {reached:?}");
    let actors: Vec<&String> = reached
        .iter()
        .filter(|module| {
            let text = std::fs::read_to_string(&modules[module.as_str()]).unwrap_or_default();
            text.contains("impl Actor for") || text.contains("impl actix::Actor for")
        })
        .collect();
    assert!(actors.is_empty(), "agent.rs reaches actors: {actors:?}");
    // The check sees an actor where there is one.
    assert!(std::fs::read_to_string(src.join("execution/actor.rs"))
        .unwrap_or_default()
        .contains("impl Actor for"));
}

#[test]
fn nothing_in_src_http_can_write_to_the_store() {
    // Built from pieces so this file does not match itself.
    let forbidden = [
        concat!(".sub", "mit("),
        concat!("Transition", "::"),
        concat!("Upsert", "::"),
        concat!("Event", "Store"),
        concat!("Store::", "open"),
        concat!(".en", "v()"),
    ];
    let mut files = Vec::new();
    let mut stack = vec![root().join("src/http")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/http").flatten() {
            let path = entry.path();
            match path.is_dir() {
                true => stack.push(path),
                false if path.extension().is_some_and(|ext| ext == "rs") => files.push(path),
                false => {}
            }
        }
    }
    assert!(files.len() > 5, "too few files in src/http: {files:?}");
    let mut hits = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            for word in forbidden.iter().filter(|word| line.contains(*word)) {
                hits.push(format!("{}:{}: {word}", path.display(), number + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "write access from src/http:\n{}",
        hits.join("\n")
    );
}

/// Issue 51: the commit rule is decided once (`storage/src/commit.rs`): neither store's
/// committer (sled's `log`, PostgreSQL's `pg`) compares payloads, epochs or versions, or
/// builds the answers that say so, of its own.
#[test]
fn the_commit_rule_is_decided_in_one_place() {
    // Built from pieces so this file does not match itself.
    let decisions = [
        concat!("payload", "_hash"),
        concat!("expected", "_version"),
        concat!("Outcome::", "VersionConflict"),
        concat!("Outcome::", "DuplicateCommand"),
        concat!("Outcome::", "CommandConflict"),
        concat!("current", "_epoch"),
        concat!("Skip", "Fencing"),
    ];
    let storage = root().join("storage/src");
    let rule = std::fs::read_to_string(storage.join("commit.rs")).expect("commit.rs");
    for word in decisions {
        assert!(
            rule.contains(word),
            "the rule no longer names {word}: update this check"
        );
    }
    let mut files = vec![storage.join("log.rs"), storage.join("pg.rs")];
    let mut stack = vec![storage.join("log"), storage.join("pg")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)
            .expect("a backend's folder")
            .flatten()
        {
            let path = entry.path();
            match path.is_dir() {
                true => stack.push(path),
                false if path.extension().is_some_and(|ext| ext == "rs") => files.push(path),
                false => {}
            }
        }
    }
    assert!(files.len() > 8, "too few backend files: {files:?}");
    let mut hits = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in decisions.iter().filter(|word| code.contains(*word)) {
                hits.push(format!("{}:{}: {word}", path.display(), number + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "a store decides what the commit rule decides:\n{}",
        hits.join("\n")
    );
}

/// Issue 51: the execution core (`actors/src/machine/`) decides without I/O. Its files
/// import no actor, store, runtime or clock; the only files of the package they reach
/// besides each other are the plain data of commands and wait requests. (Its tests, and
/// the seeded simulation that drives it as the actor would, may reach further.)
#[test]
fn the_execution_core_imports_no_effect() {
    let src = root().join("actors/src");
    let edges = edges(&src);
    let core = |module: &str| module == "machine" || module.starts_with("machine::");
    let test_only = |module: &str| {
        module.ends_with("tests") || module.ends_with("::sim") || module.ends_with("sim_checks")
    };
    let data = ["command", "command_fields", "wait_request", "error"];
    let forbidden = [
        "actix",
        "tokio",
        "futures",
        "sled",
        "reqwest",
        "EventStore",
        ".await",
        "Instant::",
        "SystemTime",
        "std::fs",
        "std::thread",
        "rand::",
    ];
    let mut found = Vec::new();
    let mut files = 0;
    for (module, imports) in edges
        .iter()
        .filter(|(module, _)| core(module) && !test_only(module))
    {
        files += 1;
        for import in imports
            .iter()
            .filter(|import| !core(import) && !data.contains(&import.as_str()))
        {
            found.push(format!("{module} imports {import}"));
        }
        let path = match module.as_str() {
            "machine" => src.join("machine/mod.rs"),
            _ => src.join(format!("{}.rs", module.replace("::", "/"))),
        };
        let text = std::fs::read_to_string(&path).expect("a core file");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in forbidden.iter().filter(|word| code.contains(*word)) {
                found.push(format!("{}:{}: {word}", path.display(), number + 1));
            }
        }
    }
    assert!(files >= 15, "too few core files: {files}");
    assert!(
        found.is_empty(),
        "the execution core reaches effects:\n{}",
        found.join("\n")
    );
}

/// Issue 51: the session's record changes only as the machine plans it: every write of it
/// (`SessionWrite`) is built in `actors/src/machine/` (C-2's line, W-7's grants), and the
/// shell and the service submit what it returns.
#[test]
fn the_session_record_write_is_built_by_the_machine() {
    let built = concat!("SessionWrite", " {");
    let mut found = Vec::new();
    let mut in_core = 0;
    let mut stack = vec![root().join("actors/src"), root().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let count = text
                .lines()
                .filter(|line| line.split("//").next().unwrap_or_default().contains(built))
                .count();
            match path.to_string_lossy().contains("actors/src/machine/") {
                true => in_core += count,
                false if count > 0 => found.push(path.display().to_string()),
                false => {}
            }
        }
    }
    assert!(
        in_core > 0,
        "the machine no longer builds {built}: update this check"
    );
    assert!(
        found.is_empty(),
        "a session write built outside the machine: {found:?}"
    );
}
