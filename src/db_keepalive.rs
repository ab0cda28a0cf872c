//! TCP keepalive and a user timeout on the database's connections (docs/design.md §5, database
//! outages).
//!
//! Why: sqlx 0.8 sets only `TCP_NODELAY` on the sockets it opens and offers no hook to set more
//! (transact-rs/sqlx#3540). A server that vanishes without closing its connections (its node
//! lost, its pod's network gone during a failover, a network cut) leaves a statement in flight
//! waiting for an answer forever: its query was acknowledged, nothing is left to retransmit, so no
//! error ever comes. The request is never answered, and once anything gives up on it the pool's
//! check of the returned connection waits forever too, so the pool is a connection short for
//! good. libpq's answer is `keepalives_idle`, `keepalives_interval`, `keepalives_count` and
//! `tcp_user_timeout`; [`arm_connections_to`] sets the same on the pool's sockets right after
//! each connect (`serve::pool_options`), finding them in `/proc/self/fd` by the database's port.

use std::time::Duration;

/// Idle time before the first keepalive probe of a database connection.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// Time between keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
/// Unanswered probes after which the connection is dead (with the two above, 11 s after the
/// server last answered; [`USER_TIMEOUT`] ends it a little sooner).
pub const KEEPALIVE_COUNT: u32 = 3;
/// Longest time data sent on a database connection may stay unacknowledged before the
/// connection is dead (`TCP_USER_TIMEOUT`). Linux also ends a connection whose keepalive probes
/// went unanswered once this long has passed since it last heard from the server: a server that
/// vanished under a waiting statement is found dead about 10 s after it last answered
/// (`tests/integration/failover.rs`: answered 10.4-10.7 s after the requests began; 15.5 s with
/// 15 s here).
pub const USER_TIMEOUT: Duration = Duration::from_secs(10);

/// Turns keepalive on ([`KEEPALIVE_IDLE`], [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_COUNT`]) and sets
/// [`USER_TIMEOUT`] on every TCP socket of this process connected to a peer port `port` that has
/// no keepalive yet; returns how many it set.
///
/// Any database connection to that port is armed, not only the newest (a connection of another
/// pool to the same server gains the same bounds). Linux only; elsewhere it sets nothing.
///
/// # Errors
/// `/proc/self/fd` cannot be read, or a socket to `port` refused an option. A descriptor closed
/// while the list is walked is skipped.
#[cfg(target_os = "linux")]
pub fn arm_connections_to(port: u16) -> std::io::Result<usize> {
    use nix::sys::socket::{AddressFamily, sockopt};
    use nix::sys::socket::{SockaddrLike, SockaddrStorage, getpeername, getsockopt, setsockopt};
    use std::os::fd::{BorrowedFd, RawFd};

    let mut armed = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(entry) = entry else { continue };
        let Some(raw) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        // Only sockets: the link names `socket:[inode]`.
        match std::fs::read_link(entry.path()) {
            Ok(target)
                if target
                    .as_os_str()
                    .as_encoded_bytes()
                    .starts_with(b"socket:") => {}
            _ => continue,
        }
        let Ok(peer) = getpeername::<SockaddrStorage>(raw) else {
            continue; // a listener, an unconnected socket, or closed meanwhile
        };
        let peer_port = match peer.family() {
            Some(AddressFamily::Inet) => peer.as_sockaddr_in().map(|a| a.port()),
            Some(AddressFamily::Inet6) => peer.as_sockaddr_in6().map(|a| a.port()),
            _ => None,
        };
        if peer_port != Some(port) {
            continue;
        }
        // SAFETY: `raw` was open when listed and is used only for the option calls below. Were
        // it closed meanwhile the calls fail with EBADF; were its number taken by a new socket in
        // between, that socket gains keepalive, which harms nothing.
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        if getsockopt(&fd, sockopt::KeepAlive).unwrap_or(true) {
            continue; // armed before (or gone)
        }
        setsockopt(
            &fd,
            sockopt::TcpKeepIdle,
            &(KEEPALIVE_IDLE.as_secs() as u32),
        )?;
        setsockopt(
            &fd,
            sockopt::TcpKeepInterval,
            &(KEEPALIVE_INTERVAL.as_secs() as u32),
        )?;
        setsockopt(&fd, sockopt::TcpKeepCount, &KEEPALIVE_COUNT)?;
        setsockopt(
            &fd,
            sockopt::TcpUserTimeout,
            &(USER_TIMEOUT.as_millis() as u32),
        )?;
        setsockopt(&fd, sockopt::KeepAlive, &true)?;
        armed += 1;
    }
    Ok(armed)
}

/// Elsewhere than Linux: sets nothing (see the Linux version).
#[cfg(not(target_os = "linux"))]
pub fn arm_connections_to(_port: u16) -> std::io::Result<usize> {
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{getsockopt, sockopt};

    /// The options land on a connection to the port, once, and not on one to another port.
    #[test]
    fn arms_connections_to_the_port_once_and_no_others() {
        let db = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to_db = std::net::TcpStream::connect(db.local_addr().unwrap()).unwrap();
        let to_other = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let port = db.local_addr().unwrap().port();

        assert_eq!(arm_connections_to(port).unwrap(), 1);
        assert!(getsockopt(&to_db, sockopt::KeepAlive).unwrap());
        assert_eq!(getsockopt(&to_db, sockopt::TcpKeepIdle).unwrap(), 5);
        assert_eq!(getsockopt(&to_db, sockopt::TcpKeepInterval).unwrap(), 2);
        assert_eq!(getsockopt(&to_db, sockopt::TcpKeepCount).unwrap(), 3);
        assert_eq!(getsockopt(&to_db, sockopt::TcpUserTimeout).unwrap(), 10_000);
        assert!(!getsockopt(&to_other, sockopt::KeepAlive).unwrap());
        // The listener itself has no peer; the accepted end's peer port is the client's.
        assert_eq!(arm_connections_to(port).unwrap(), 0, "armed twice");
    }
}
