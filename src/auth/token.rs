//! Bearer-token primitives (docs/design.md §5): 256-bit random secrets, stored only as SHA-256 hashes,
//! compared in constant time.
//!
//! Agent tokens read `pullman_<token id, 32 hex>_<secret, 43 base64url>`: the id finds the row by
//! primary key, and the secret's hash is compared in constant time, so neither the lookup nor the
//! comparison leaks how much of a guess was right.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

const PREFIX: &str = "pullman_";

/// A newly minted agent token: the text shown once, and what is stored.
pub struct MintedToken {
    pub id: Uuid,
    /// The full bearer token; shown to the caller once, never stored or logged.
    pub text: String,
    pub secret_hash: Vec<u8>,
}

/// Mints a fresh agent token with 256 bits of secret.
pub fn mint_agent_token() -> MintedToken {
    let id = Uuid::new_v4();
    let secret = random_secret();
    MintedToken {
        id,
        text: format!("{PREFIX}{}_{secret}", id.simple()),
        secret_hash: hash(&secret),
    }
}

/// A random 256-bit secret, base64url without padding (43 characters).
pub fn random_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Splits an agent token into its id and secret; `None` when it is not shaped like one.
pub fn parse_agent_token(text: &str) -> Option<(Uuid, &str)> {
    let rest = text.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    if id.len() != 32 || secret.is_empty() {
        return None;
    }
    Some((Uuid::try_parse(id).ok()?, secret))
}

/// SHA-256 of a secret. Secrets carry ≥ 128 bits of entropy, so a fast hash suffices.
pub fn hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Constant-time comparison of a presented secret with a stored hash.
pub fn verify(secret: &str, stored_hash: &[u8]) -> bool {
    hash(secret).ct_eq(stored_hash).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_parse_and_verify() {
        let t = mint_agent_token();
        let (id, secret) = parse_agent_token(&t.text).unwrap();
        assert_eq!(id, t.id);
        assert!(verify(secret, &t.secret_hash));
        assert!(!verify("wrong", &t.secret_hash));
        assert_ne!(mint_agent_token().text, t.text);
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert!(parse_agent_token("").is_none());
        assert!(parse_agent_token("pullman_").is_none());
        assert!(parse_agent_token("pullman_abc_def").is_none());
        assert!(parse_agent_token("Bearer x").is_none());
    }
}
