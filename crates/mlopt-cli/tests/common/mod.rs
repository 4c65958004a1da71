//! What the end-to-end tests that build and link programs share: a fixture's path, a command that must
//! succeed, and outputs compared with expected values.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `fixtures/<rel>` of the repository.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
}

/// Runs `cmd`, which must succeed (its stderr is the failure's message).
pub fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `got` equals `want` in length and within 1e-4 relative (1e-4 absolute below 1) element by element.
pub fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{what}: {g} vs {w}"
        );
    }
}
