//! Puts the git commit into `pullman --version` (issue #15): `PULLMAN_GIT_COMMIT` is the short
//! hash of HEAD, or `unknown` outside a git checkout (a source tarball, a Docker build context
//! without `.git`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PULLMAN_GIT_COMMIT={commit}");
    // In a worktree `.git` is a file; ask git where HEAD and the refs really live, so a commit or
    // a checkout rebuilds the version string and nothing else does.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        println!("cargo:rerun-if-changed={common}/refs");
        println!("cargo:rerun-if-changed={common}/packed-refs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
