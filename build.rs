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
    // a checkout rebuilds the version string and nothing else does. Only paths that exist: cargo
    // reads a missing one as changed on every build (a checkout without `packed-refs`, such as a
    // fresh `git init` or many worktrees, then recompiled the crate each time).
    let mut watch = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watch.push(format!("{dir}/HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        watch.push(format!("{common}/refs"));
        watch.push(format!("{common}/packed-refs"));
    }
    for path in watch.iter().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
