//! A path to a server that can be cut the way a lost node or a torn-down pod network cuts it:
//! packets dropped in both directions, nothing closed, so neither end hears of it (the case
//! `pullman::db_keepalive` exists for). A forwarder on its own loopback port carries each
//! connection to the server; [`Cut::cut`] drops that port's packets with iptables. Needs root
//! and `iptables` ([`Cut::possible`] says whether this machine has them; CI does).

use std::net::SocketAddr;
use std::process::Command;

/// The forwarder, and the iptables rules while cut (removed on drop).
pub struct Cut {
    /// The forwarder's port on 127.0.0.1: connect here to reach the server.
    pub port: u16,
    rules_in: bool,
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
        tokio::spawn(async move {
            while let Ok((mut from, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut to) = tokio::net::TcpStream::connect(server).await {
                        let _ = tokio::io::copy_bidirectional(&mut from, &mut to).await;
                    }
                });
            }
        });
        Cut {
            port,
            rules_in: false,
        }
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
