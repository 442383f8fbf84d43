//! The admin token (`ADMIN_TOKEN_FILE`) that state-changing HTTP endpoints (`POST /reset`)
//! require as `Authorization: Bearer <token>`. Read once at start; compared in constant time
//! (the work does not depend on where the tokens differ, nor on the presented token's
//! length: both sides are hashed to 32 bytes first, by xxh3-128 twice, keyed apart); logged
//! only by its fingerprint, never itself.

use xxhash_rust::xxh3::{xxh3_128, xxh3_128_with_seed, xxh3_64};

/// The most bytes of a token file: a token is a line, not a document.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Why the token file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// It cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It holds no token (only whitespace).
    #[error("{0}: the file holds no token")]
    Empty(String),
    /// It is too long to be a token.
    #[error("{0}: more than {MAX_TOKEN_BYTES} bytes; a token is one line")]
    TooLong(String),
}

/// The admin token. `Debug` shows the fingerprint only.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    digest: [u8; 32],
    fingerprint: String,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminToken({})", self.fingerprint)
    }
}

/// Both halves of the digest: a 256-bit comparison, so no second preimage of the hash is
/// within reach of a guesser.
fn digest(b: &[u8]) -> [u8; 32] {
    let mut d = [0; 32];
    d[..16].copy_from_slice(&xxh3_128(b).to_le_bytes());
    d[16..].copy_from_slice(&xxh3_128_with_seed(b, 0x5eed_ad31).to_le_bytes());
    d
}

/// The fingerprint logs name a token by: 8 hex digits of a hash of it, enough to tell two
/// tokens apart in logs and far too few to find the token from.
pub fn fingerprint(token: &[u8]) -> String {
    format!("{:08x}", xxh3_64(token) >> 32)
}

impl AdminToken {
    /// The token `text` (surrounding whitespace, a trailing newline of a Secret's file
    /// included, trimmed).
    pub fn new(text: &str) -> Option<Self> {
        let t = text.trim();
        (!t.is_empty()).then(|| AdminToken {
            digest: digest(t.as_bytes()),
            fingerprint: fingerprint(t.as_bytes()),
        })
    }

    /// Reads the token from `path`.
    ///
    /// # Errors
    /// The file cannot be read, holds nothing or too much.
    pub fn from_file(path: &std::path::Path) -> Result<Self, TokenError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| TokenError::Read {
            path: name.clone(),
            source,
        })?;
        if bytes.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLong(name));
        }
        Self::new(&String::from_utf8_lossy(&bytes)).ok_or(TokenError::Empty(name))
    }

    /// The token's fingerprint ([`fingerprint`]).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Whether `presented` is the token, in constant time (see the module docs).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let d = digest(presented);
        let diff = self
            .digest
            .iter()
            .zip(d.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_itself_matches_and_debug_shows_no_secret() {
        let t = AdminToken::new("s3cret-token\n").unwrap();
        assert!(t.matches(b"s3cret-token"));
        assert!(!t.matches(b"s3cret-tokeN"));
        assert!(!t.matches(b"s3cret-token "));
        assert!(!t.matches(b""));
        let shown = format!("{t:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(t.fingerprint(), fingerprint(b"s3cret-token"));
        assert!(AdminToken::new(" \n").is_none());
    }
}
