//! A path to a server that can be cut the way a lost node or a torn-down pod network cuts it:
//! packets dropped in both directions, nothing closed, so neither end hears of it (the case
//! `pullman::db_keepalive` exists for); or frozen, as a stopped server process or a proxy whose
//! server is gone: connections open and acknowledged, nothing carried (the case `serve
//! --request-timeout-seconds` exists for). A forwarder on its own loopback port carries each
//! connection to the server; [`Cut::cut`] drops that port's packets with iptables, which needs
//! root and `iptables` ([`Cut::possible`] says whether this machine has them; CI does);
//! [`Cut::freeze`] needs nothing.

use std::net::SocketAddr;
use std::process::Command;

/// The forwarder, and the iptables rules while cut (removed on drop).
pub struct Cut {
    /// The forwarder's port on 127.0.0.1: connect here to reach the server.
    pub port: u16,
    rules_in: bool,
    frozen: tokio::sync::watch::Sender<bool>,
}

/// The two rules: packets to the forwarder's port and from it, on the loopback interface.
fn rules(port: u16) -> [Vec<String>; 2] {
    let p = port.to_string();
    [
        [
            "INPUT", "-i", "lo", "-p", "tcp", "--dport", &p, "-j", "DROP",
        ]
        .map(String::from)
        .to_vec(),
        [
            "INPUT", "-i", "lo", "-p", "tcp", "--sport", &p, "-j", "DROP",
        ]
        .map(String::from)
        .to_vec(),
    ]
}

fn iptables(action: &str, rule: &[String]) -> bool {
    Command::new("iptables")
        .arg("-w")
        .arg(action)
        .args(rule)
        .status()
        .is_ok_and(|s| s.success())
}

impl Cut {
    /// Whether this process can cut (root, and `iptables` answers).
    pub fn possible() -> bool {
        nix::unistd::geteuid().is_root()
            && Command::new("iptables")
                .args(["-w", "-L", "INPUT", "-n"])
                .output()
                .is_ok_and(|o| o.status.success())
    }

    /// Starts forwarding connections on a free loopback port to `server`.
    pub async fn to(server: SocketAddr) -> Cut {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the forwarder");
        let port = listener
            .local_addr()
            .expect("the forwarder's address")
            .port();
        let (frozen, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((from, _)) = listener.accept().await {
                let watch = watch.clone();
                tokio::spawn(async move {
                    if let Ok(to) = tokio::net::TcpStream::connect(server).await {
                        let (from_r, from_w) = from.into_split();
                        let (to_r, to_w) = to.into_split();
                        tokio::spawn(carry(from_r, to_w, watch.clone()));
                        carry(to_r, from_w, watch).await;
                    }
                });
            }
        });
        Cut {
            port,
            rules_in: false,
            frozen,
        }
    }

    /// Stops carrying bytes either way; connections stay open (and their packets acknowledged).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Carries bytes again, what arrived meanwhile first.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Drops every packet to and from the forwarder's port from now on.
    ///
    /// # Panics
    /// When iptables refuses a rule.
    pub fn cut(&mut self) {
        self.rules_in = true;
        for rule in rules(self.port) {
            assert!(iptables("-I", &rule), "iptables -I {}", rule.join(" "));
        }
    }

    /// Lets packets through again.
    pub fn mend(&mut self) {
        if std::mem::take(&mut self.rules_in) {
            for rule in rules(self.port) {
                iptables("-D", &rule);
            }
        }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.mend();
    }
}

/// Copies `from` to `to`, holding each read while frozen.
async fn carry(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
