//! What Baton's end-to-end suites (`tests/tests/*.rs`) share: where the
//! repository and the `baton` binary are, how long to wait, and the
//! fixtures each family of suites starts:
//!
//! - [`support`]: live `baton dev` clusters (replica processes on the
//!   embedded or on real stores), a single sidecar ([`support::Replica`]),
//!   and Chromium ([`support::browser`]);
//! - [`operator_support`]: one real control plane per test binary,
//!   namespaces, `baton operator` processes with exactly the generated
//!   RBAC, and the test node that runs pods ([`operator_support::node`]).
//!
//! Each suite is its own test binary, so each has its own statics: one
//! control plane per binary, not per test.

pub mod operator_support;
pub mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::LazyLock;
use std::time::Duration;

/// The repository's root.
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// How long the operator suites wait for a convergence; generous for a
/// loaded 2-core machine, never slept.
pub const CONVERGE: Duration = Duration::from_secs(60);
/// Pause between reads while waiting.
pub const POLL: Duration = Duration::from_millis(100);

/// The `baton` binary the suites run: `BATON_BIN` when set (`scripts/test`
/// builds it before any suite starts and sets it), else the one next to
/// this test binary, built first with `cargo build -p baton` (a no-op when
/// it is fresh) so a suite run on its own never runs a stale binary.
pub fn baton() -> &'static str {
    static PATH: LazyLock<String> = LazyLock::new(|| {
        if let Some(path) = std::env::var_os("BATON_BIN") {
            return path.to_string_lossy().into_owned();
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--locked", "-p", "baton", "--bin", "baton"])
            .current_dir(REPO)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p baton --bin baton failed");
        let exe = std::env::current_exe().expect("the test binary's path");
        // target/debug/deps/<suite>-<hash> → target/debug/baton
        let binary: PathBuf = exe
            .ancestors()
            .nth(2)
            .expect("a test binary in target/<profile>/deps")
            .join("baton");
        assert!(binary.is_file(), "no baton binary at {}", binary.display());
        binary.to_string_lossy().into_owned()
    });
    &PATH
}
