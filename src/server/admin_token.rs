//! The admin token (`ADMIN_TOKEN_FILE`) that the admin endpoints (`POST /reset`, `GET /top`)
//! require as `Authorization: Bearer <token>`, and the one check both make ([`authorize`]:
//! 401 with `WWW-Authenticate: Bearer`). Read once at start; compared in constant time
//! (the work does not depend on where the tokens differ, nor on the presented token's
//! length: both sides are hashed to 32 bytes first, by xxh3-128 twice, keyed apart); logged
//! only by its fingerprint, never itself.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
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

/// The bearer token of `Authorization`, if any.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = v.split_at(v.len().min(7));
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

/// A refused admin request: answered 401 with `WWW-Authenticate: Bearer` and why.
#[derive(Debug)]
pub struct Unauthorized(String);

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"sluice\"")],
            format!("{}\n", self.0),
        )
            .into_response()
    }
}

/// Whether a request to the admin endpoint `what` (`reset`, `top`) presents `token`: the
/// token when it does, else why not (also when no token is configured), logged
/// at warn with the peer and the presented token's fingerprint, never the token.
///
/// # Errors
/// [`Unauthorized`]: answer it (401).
pub fn authorize<'t>(
    token: Option<&'t AdminToken>,
    headers: &HeaderMap,
    peer: &str,
    what: &str,
) -> Result<&'t AdminToken, Unauthorized> {
    let Some(token) = token else {
        tracing::warn!(%peer, "{what} refused: no admin token is configured (ADMIN_TOKEN_FILE)");
        return Err(Unauthorized(format!(
            "{what} refused: no admin token is configured (ADMIN_TOKEN_FILE)"
        )));
    };
    match bearer(headers) {
        Some(p) if token.matches(p) => Ok(token),
        presented => {
            let presented = presented.map_or_else(|| "none".into(), fingerprint);
            tracing::warn!(%peer, token = %presented, "{what} refused: wrong or missing bearer token");
            Err(Unauthorized(format!(
                "{what} refused: wrong or missing bearer token"
            )))
        }
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
