//! I-1, issue 30: an embedder's dependency on the library (`default-features = false`)
//! brings the runtime and none of the server: no HTTP server or client, no CLI parser, no
//! load generator's crates, no allocator. Read from `cargo tree` over the lockfile (no
//! build, no network); `.ci/run` also builds and runs `examples/embed.rs` that way.

use std::process::Command;

#[test]
fn i1_an_embedder_gets_the_runtime_without_the_server() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-e",
            "normal",
            "--no-default-features",
            "-p",
            "openprogram",
        ])
        .args(["--prefix", "none", "--offline", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree");
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    for needed in [
        "openprogram-actors",
        "openprogram-storage",
        "actix",
        "sled",
        "tokio",
    ] {
        assert!(crates.contains(&needed), "{needed} missing from:\n{tree}");
    }
    for server_only in [
        "actix-web",
        "ureq",
        "clap",
        "tikv-jemallocator",
        "indicatif",
        "hdrhistogram",
        "tempfile",
        "reqwest",
        "tracing-subscriber",
        "opentelemetry",
        "opentelemetry-otlp",
    ] {
        assert!(
            !crates.contains(&server_only),
            "an embedder compiles {server_only}:\n{tree}"
        );
    }
}
