//! Two things made at build time:
//!
//! - The git commit in `pullman --version` (issue #15): `PULLMAN_GIT_COMMIT` is the short hash of
//!   HEAD, or `unknown` outside a git checkout (a source tarball, a Docker build context without
//!   `.git`).
//! - The queue's SQL statements with their shared fragments in place (`src/queue/sql/mod.rs`): a
//!   line `-- @include <fragment>.sql` in a statement stands for that fragment's text (its head
//!   comment left out), indented as the line is. Each rule is written once, in its fragment, and
//!   the statements the server runs are whole: `$OUT_DIR/sql/<statement>.sql`.

use std::path::Path;
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
    version();
    expand_sql(Path::new("src/queue/sql"));
    // sqlx::migrate! embeds migrations/ but does not tell cargo to watch it: without this line a
    // new migration is left out of the build until something else changes.
    println!("cargo:rerun-if-changed=migrations");
}

fn version() {
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

/// Writes every `.sql` file of `dir` to `$OUT_DIR/sql/` with its `-- @include` lines expanded.
/// Panics (failing the build, naming the file) on a missing fragment or an include cycle.
fn expand_sql(dir: &Path) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let out = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("sql");
    std::fs::create_dir_all(&out).expect("create $OUT_DIR/sql");
    for entry in std::fs::read_dir(dir).expect("read src/queue/sql") {
        let name = entry.expect("read src/queue/sql").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".sql") {
            let mut expanded = String::new();
            expand(dir, &read_sql(dir, &name), "", 0, &mut expanded);
            std::fs::write(out.join(&*name), expanded).expect("write $OUT_DIR/sql");
        }
    }
}

/// Appends `text` to `out`, each line after `indent`, with each `-- @include <file>` line
/// replaced by that fragment's lines after its head comment, indented as the include line is.
fn expand(dir: &Path, text: &str, indent: &str, depth: usize, out: &mut String) {
    assert!(
        depth < 8,
        "src/queue/sql: includes nest too deep (a cycle?)"
    );
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(fragment) = trimmed.strip_prefix("-- @include ") {
            let fragment_text = read_sql(dir, fragment.trim());
            let body = fragment_text
                .lines()
                .skip_while(|l| l.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            let inner = format!("{indent}{}", &line[..line.len() - trimmed.len()]);
            expand(dir, &body, &inner, depth + 1, out);
        } else {
            out.push_str(indent);
            out.push_str(line);
            out.push('\n');
        }
    }
}

fn read_sql(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}
