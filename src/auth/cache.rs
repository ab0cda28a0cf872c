//! Agent tokens verified a moment ago, so an agent's stream of claim, heartbeat and complete
//! calls does not cost a database read each (issue #7: two of the four statements per work order
//! on the pull path were token look-ups).
//!
//! An entry holds the token's SHA-256 hash (never the secret) and lives [`VERIFIED_TTL`].
//! Each entry also holds the queue's count of token revocations
//! ([`crate::queue::Queue::token_revocations`]) as read before the database confirmed it; it is
//! trusted only while that count is unchanged, so a revocation (rotate, retire) through this
//! process takes effect at once; other server replicas honour it within the TTL. Only successes
//! are kept: a bad token is looked up every time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::token;

/// How long a verified token is trusted without asking the database again.
pub const VERIFIED_TTL: Duration = Duration::from_secs(1);

/// Entries kept before expired ones are swept.
const SWEEP_AT: usize = 4096;

struct Verified {
    secret_hash: Vec<u8>,
    agent_id: Uuid,
    at: Instant,
    revocations: u64,
}

/// Recently verified agent tokens, by token id. Shared by all requests of a process.
#[derive(Default)]
pub struct VerifiedTokens {
    entries: Mutex<HashMap<Uuid, Verified>>,
}

impl VerifiedTokens {
    /// The agent of token `token_id` if it was verified within the TTL with this same secret
    /// and no revocation happened since (`revocations` is the queue's count now).
    pub fn agent_for(&self, token_id: Uuid, secret: &str, revocations: u64) -> Option<Uuid> {
        let presented = token::hash(secret);
        let entries = self.entries.lock().expect("token cache lock");
        let hit = entries.get(&token_id)?;
        let fresh = hit.at.elapsed() < VERIFIED_TTL && hit.revocations == revocations;
        let same: bool = presented.ct_eq(&hit.secret_hash).into();
        (fresh && same).then_some(hit.agent_id)
    }

    /// Records a successful verification against the database; `revocations` is the queue's
    /// count as read *before* the database read.
    pub fn remember(&self, token_id: Uuid, secret: &str, agent_id: Uuid, revocations: u64) {
        let mut entries = self.entries.lock().expect("token cache lock");
        if entries.len() >= SWEEP_AT {
            entries.retain(|_, v| v.at.elapsed() < VERIFIED_TTL);
        }
        entries.insert(
            token_id,
            Verified {
                secret_hash: token::hash(secret),
                agent_id,
                at: Instant::now(),
                revocations,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_token_is_trusted_only_with_its_secret_and_until_a_revocation() {
        let cache = VerifiedTokens::default();
        let (token, agent) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(cache.agent_for(token, "s3cret", 7), None);
        cache.remember(token, "s3cret", agent, 7);
        assert_eq!(cache.agent_for(token, "s3cret", 7), Some(agent));
        assert_eq!(cache.agent_for(token, "guess", 7), None);
        assert_eq!(cache.agent_for(token, "s3cret", 8), None);
    }

    #[test]
    fn entries_expire() {
        let cache = VerifiedTokens::default();
        let (token, agent) = (Uuid::new_v4(), Uuid::new_v4());
        cache.remember(token, "s", agent, 0);
        cache.entries.lock().unwrap().get_mut(&token).unwrap().at -= VERIFIED_TTL;
        assert_eq!(cache.agent_for(token, "s", 0), None);
    }
}
