//! Agent tokens verified a moment ago, so an agent's stream of claim, heartbeat and complete
//! calls does not cost a database read each (issue #7: two of the four statements per work order
//! on the pull path were token look-ups).
//!
//! An entry holds the token's SHA-256 hash (never the secret) and lives [`VERIFIED_TTL`].
//! Revocation (rotate, retire) evicts the agent's entries at once in the process that revoked;
//! other server replicas honour it within the TTL. Only successes are kept: a bad token is looked
//! up every time.

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
}

/// Recently verified agent tokens, by token id. Shared by all requests of a process.
#[derive(Default)]
pub struct VerifiedTokens {
    entries: Mutex<HashMap<Uuid, Verified>>,
}

impl VerifiedTokens {
    /// The agent of token `token_id` if it was verified within the TTL with this same secret.
    pub fn agent_for(&self, token_id: Uuid, secret: &str) -> Option<Uuid> {
        let presented = token::hash(secret);
        let entries = self.entries.lock().expect("token cache lock");
        let hit = entries.get(&token_id)?;
        let fresh = hit.at.elapsed() < VERIFIED_TTL;
        let same: bool = presented.ct_eq(&hit.secret_hash).into();
        (fresh && same).then_some(hit.agent_id)
    }

    /// Records a successful verification against the database.
    pub fn remember(&self, token_id: Uuid, secret: &str, agent_id: Uuid) {
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
            },
        );
    }

    /// Forgets every token of `agent_id` (after its tokens were revoked).
    pub fn forget_agent(&self, agent_id: Uuid) {
        self.entries
            .lock()
            .expect("token cache lock")
            .retain(|_, v| v.agent_id != agent_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_token_is_trusted_only_with_its_secret_and_until_forgotten() {
        let cache = VerifiedTokens::default();
        let (token, agent) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(cache.agent_for(token, "s3cret"), None);
        cache.remember(token, "s3cret", agent);
        assert_eq!(cache.agent_for(token, "s3cret"), Some(agent));
        assert_eq!(cache.agent_for(token, "guess"), None);
        cache.forget_agent(agent);
        assert_eq!(cache.agent_for(token, "s3cret"), None);
    }

    #[test]
    fn entries_expire() {
        let cache = VerifiedTokens::default();
        let (token, agent) = (Uuid::new_v4(), Uuid::new_v4());
        cache.remember(token, "s", agent);
        cache.entries.lock().unwrap().get_mut(&token).unwrap().at -= VERIFIED_TTL;
        assert_eq!(cache.agent_for(token, "s"), None);
    }
}
