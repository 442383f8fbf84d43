//! Connections to Redis: the settings every shard shares ([`RedisOptions`]), URLs in the
//! reference's forms with auth and TLS folded in ([`normalize_url`]), secrets kept out of names
//! ([`redact`]), and the connection pools of standalone shards and of a cluster.

use deadpool_redis::{Config, Pool, Runtime};

/// Redis connection settings shared by every shard.
#[derive(Clone, Default)]
pub struct RedisOptions {
    /// `password` or `user:password` (`REDIS_AUTH`), used when a URL carries none.
    pub auth: Option<String>,
    /// Prefix of every key (`CACHE_KEY_PREFIX`).
    pub prefix: String,
    /// Connections per shard.
    pub pool_size: usize,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// Turns a `REDIS_URL` entry into a URL: `host:port` (the reference's form) gets `redis://`,
/// or `rediss://` with `tls` (`REDIS_TLS`); `auth` is added when the URL has no credentials
/// of its own. TLS verifies the server against the system's roots (`SSL_CERT_FILE` names
/// another bundle).
///
/// # Errors
/// A scheme other than `redis://` or `rediss://`.
pub fn normalize_url(raw: &str, auth: Option<&str>, tls: bool) -> Result<String, String> {
    let raw = raw.trim();
    let (scheme, rest) = if let Some(r) = raw.strip_prefix("redis://") {
        (if tls { "rediss" } else { "redis" }, r)
    } else if let Some(r) = raw.strip_prefix("rediss://") {
        ("rediss", r)
    } else if raw.contains("://") {
        return Err(format!(
            "'{}': not a redis:// or rediss:// URL",
            redact(raw)
        ));
    } else {
        (if tls { "rediss" } else { "redis" }, raw)
    };
    match auth {
        Some(a) if !rest.contains('@') && !a.is_empty() => {
            let (user, pass) = a.split_once(':').unwrap_or(("", a));
            Ok(format!(
                "{scheme}://{}:{}@{rest}",
                encode(user),
                encode(pass)
            ))
        }
        _ => Ok(format!("{scheme}://{rest}")),
    }
}

/// Installs the TLS crypto provider once per process (rustls needs one chosen explicitly).
pub fn init_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Percent-encodes everything but unreserved characters, for credentials in a URL.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A URL without its credentials, for logs and readiness.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}{}", &url[..s + 3], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// A connection pool to the standalone Redis at `url` (normalized), `pool_size` connections;
/// connections are made lazily.
///
/// # Errors
/// When the URL is unusable.
pub(crate) fn pool(url: &str, opts: &RedisOptions) -> Result<Pool, String> {
    let mut cfg = Config::from_url(url);
    cfg.pool = Some(deadpool_redis::PoolConfig::new(opts.pool_size.max(1)));
    cfg.create_pool(Some(Runtime::Tokio1))
        .map_err(|e| format!("{}: {e}", redact(url)))
}

/// A connection pool to the Redis Cluster reached through `seeds` (normalized URLs).
///
/// # Errors
/// When the URLs are unusable.
pub(crate) fn cluster_pool(
    seeds: &[String],
    opts: &RedisOptions,
) -> Result<deadpool_redis::cluster::Pool, String> {
    let mut cfg = deadpool_redis::cluster::Config::from_urls(seeds.to_vec());
    cfg.pool = Some(deadpool_redis::PoolConfig::new(opts.pool_size.max(1)));
    cfg.create_pool(Some(Runtime::Tokio1))
        .map_err(|e| format!("cluster: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_the_reference_form_and_auth() {
        assert_eq!(
            normalize_url("localhost:6379", None, false).unwrap(),
            "redis://localhost:6379"
        );
        assert_eq!(
            normalize_url("redis://h:1/0", Some("s3cr@t"), false).unwrap(),
            "redis://:s3cr%40t@h:1/0"
        );
        assert_eq!(
            normalize_url("h:1", Some("u:p"), false).unwrap(),
            "redis://u:p@h:1"
        );
        assert_eq!(
            normalize_url("redis://a:b@h:1", Some("x"), false).unwrap(),
            "redis://a:b@h:1"
        );
        assert_eq!(normalize_url("h:1", None, true).unwrap(), "rediss://h:1");
        assert_eq!(
            normalize_url("rediss://h:1", None, false).unwrap(),
            "rediss://h:1"
        );
        assert!(normalize_url("http://h:1", None, false).is_err());
    }

    #[test]
    fn names_never_carry_credentials() {
        assert_eq!(redact("redis://user:pw@host:6379/0"), "redis://host:6379/0");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }
}
