//! Standard output of the commands that print (admin commands, `completion`, `crdgen`).
//!
//! Printing into a pipe whose reader has gone (`pullman log list | head -1`) ends the process as
//! it ends `git`, `gh` and `kubectl`: quietly, killed by SIGPIPE (a shell reports 141; with
//! `set -o pipefail` the pipeline fails as theirs does), never with a panic. Rust ignores SIGPIPE
//! so that sockets report EPIPE as an error; the default action is restored only at the moment
//! standard output is found closed. `println!` would panic instead, so the crate denies it
//! (`clippy::print_stdout`) and prints through [`outln!`](crate::outln) and
//! [`out!`](crate::out).

use std::io::Write;

/// Writes formatted text to standard output; a closed pipe ends the process (see the module).
/// Other write errors end it with exit status 1 and a message on stderr.
pub fn write_fmt(args: std::fmt::Arguments<'_>) {
    let result = std::io::stdout().lock().write_fmt(args);
    if let Err(e) = result {
        failed(e);
    }
}

/// Writes bytes to standard output and flushes them, as [`write_fmt`].
pub fn write_all(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        failed(e);
    }
}

fn failed(error: std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        die_of_sigpipe();
    }
    eprintln!("error: writing to standard output: {error}");
    std::process::exit(1);
}

/// Ends the process by SIGPIPE, as a program that never ignored it would end.
fn die_of_sigpipe() -> ! {
    use nix::sys::signal::{SigHandler, Signal, raise, signal};
    // SAFETY: restores the default disposition; no handler code runs, and nothing else in this
    // process relies on SIGPIPE being ignored from here on, as it ends now.
    unsafe {
        let _ = signal(Signal::SIGPIPE, SigHandler::SigDfl);
    }
    let _ = raise(Signal::SIGPIPE);
    // Unreachable unless the signal is blocked: exit with the status a shell would show.
    std::process::exit(128 + Signal::SIGPIPE as i32);
}

/// `println!` to standard output through [`write_fmt`]: a closed pipe ends the process quietly.
#[macro_export]
macro_rules! outln {
    () => { $crate::stdout::write_fmt(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdout::write_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` to standard output through [`write_fmt`]: a closed pipe ends the process quietly.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write_fmt(format_args!($($arg)*)) };
}
