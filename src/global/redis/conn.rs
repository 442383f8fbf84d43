//! Redis connection settings: what every shard shares ([`RedisOptions`]), URLs in the
//! reference's forms with auth and TLS folded in ([`normalize_url`]), secrets kept out of names
//! ([`redact`]), and the clients each deployment is dialled with (the client certificate, CA
//! and hostname policy of [`RedisTls`] applied to all). The pools are in `pool.rs`.

use deadpool_redis::redis;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// What TLS to Redis presents and trusts beyond the `rediss://` scheme
/// (`REDIS_TLS_CLIENT_CERT`/`_KEY`, `REDIS_TLS_CACERT`, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`,
/// shared by the per-second Redis as in the reference). Applies to TLS URLs only.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// The client certificate (mTLS) and the CA bundle replacing the system's roots, as PEM;
    /// `None`: neither.
    pub certs: Option<redis::TlsCertificates>,
    /// Verify the server's chain but not that it names the host dialled.
    pub skip_hostname_verification: bool,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret; the rest says nothing worth printing.
        let certs = self.certs.as_ref();
        f.debug_struct("RedisTls")
            .field(
                "client_cert",
                &certs.is_some_and(|c| c.client_tls.is_some()),
            )
            .field("ca", &certs.is_some_and(|c| c.root_cert.is_some()))
            .field(
                "skip_hostname_verification",
                &self.skip_hostname_verification,
            )
            .finish()
    }
}

/// Redis connection settings shared by every shard.
#[derive(Clone, Default)]
pub struct RedisOptions {
    /// `password` or `user:password` (`REDIS_AUTH`), used when a URL carries none.
    pub auth: Option<String>,
    /// Prefix of every key (`CACHE_KEY_PREFIX`).
    pub prefix: String,
    /// Connections per shard.
    pub pool_size: usize,
    /// Client certificate, CA and hostname policy of TLS connections.
    pub tls: RedisTls,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("tls", &self.tls)
            .finish()
    }
}

/// A `REDIS_URL` entry that is not a Redis URL (shown without its credentials).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}': not a redis:// or rediss:// URL")]
pub struct UrlError(String);

/// Turns a `REDIS_URL` entry into a URL: `host:port` (the reference's form) gets `redis://`,
/// or `rediss://` with `tls` (`REDIS_TLS`); `auth` is added when the URL has no credentials
/// of its own. TLS verifies the server against the system's roots (`SSL_CERT_FILE` names
/// another bundle).
///
/// # Errors
/// A scheme other than `redis://` or `rediss://`.
pub fn normalize_url(raw: &str, auth: Option<&str>, tls: bool) -> Result<String, UrlError> {
    let raw = raw.trim();
    let (scheme, rest) = if let Some(r) = raw.strip_prefix("redis://") {
        (if tls { "rediss" } else { "redis" }, r)
    } else if let Some(r) = raw.strip_prefix("rediss://") {
        ("rediss", r)
    } else if raw.contains("://") {
        return Err(UrlError(redact(raw)));
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

/// The master a Sentinel deployment names (`REDIS_TYPE=SENTINEL`): the sentinels are the
/// URLs (with `REDIS_SENTINEL_AUTH` folded in), the master's credentials are
/// [`RedisOptions::auth`] (`REDIS_AUTH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelMaster {
    /// The master's name in the sentinels' configuration (`REDIS_URL`'s first entry).
    pub name: String,
    /// TLS to the master too (`REDIS_TLS`: the reference dials sentinels and master alike).
    pub tls: bool,
}

/// `url` (normalized) as the redis crate dials it, with `tls`'s certificates and hostname
/// policy when the URL is TLS.
pub(crate) fn connection_info(url: &str, tls: &RedisTls) -> redis::RedisResult<ConnectionInfo> {
    let mut info = url.into_connection_info()?;
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return Ok(info);
    }
    if let Some(certs) = &tls.certs {
        // The crate parses the PEM into the address's TLS parameters only through a client.
        info = redis::Client::build_with_tls(info, certs.clone())?
            .get_connection_info()
            .clone();
    }
    if tls.skip_hostname_verification {
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        info = info.set_addr(addr);
    }
    Ok(info)
}

/// The Sentinel client of `RedisPool::sentinel`: the sentinels dialled as their URLs say (their
/// credentials and, over TLS, `opts.tls`), the master with `opts.auth` and, when
/// `master.tls`, `opts.tls`'s certificates.
pub(crate) fn sentinel_client(
    sentinels: &[String],
    master: &SentinelMaster,
    opts: &RedisOptions,
) -> redis::RedisResult<redis::sentinel::SentinelClient> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let infos = sentinels
        .iter()
        .map(|u| connection_info(u, &opts.tls))
        .collect::<redis::RedisResult<Vec<_>>>()?;
    // The builder takes the sentinels' credentials once for all: REDIS_SENTINEL_AUTH is one.
    let creds = infos
        .iter()
        .map(ConnectionInfo::redis_settings)
        .find(|r| r.password().is_some());
    let mut b = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        &master.name,
        SentinelServerType::Master,
    )?;
    if let Some(r) = creds {
        if let Some(user) = r.username() {
            b = b.set_client_to_sentinel_username(user);
        }
        if let Some(pass) = r.password() {
            b = b.set_client_to_sentinel_password(pass);
        }
    }
    if let Some(a) = opts.auth.as_deref().filter(|a| !a.is_empty()) {
        let (user, pass) = a.split_once(':').unwrap_or(("", a));
        if !user.is_empty() {
            b = b.set_client_to_redis_username(user);
        }
        b = b.set_client_to_redis_password(pass);
    }
    if master.tls {
        b = b.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        if let Some(certs) = &opts.tls.certs {
            b = b.set_client_to_redis_certificates(certs.clone());
        }
    }
    b.build()
}

/// A Sentinel shard's name, for logs, metrics and routing: the master's name and the
/// sentinels, without credentials.
pub fn sentinel_name(sentinels: &[String], master: &SentinelMaster) -> String {
    let list: Vec<String> = sentinels.iter().map(|u| redact(u)).collect();
    format!("sentinel({}@{})", master.name, list.join(","))
}

/// The cluster client of `RedisPool::cluster`: the seeds' credentials, and over TLS `opts.tls`
/// (the crate applies one TLS configuration to every node it discovers).
pub(crate) fn cluster_client(
    seeds: &[String],
    opts: &RedisOptions,
) -> redis::RedisResult<redis::cluster::ClusterClient> {
    let infos = seeds
        .iter()
        .map(|u| u.as_str().into_connection_info())
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let tls = infos
        .first()
        .is_some_and(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. }));
    // Every call has sluice's own timeout around it (`REDIS_TIMEOUT`); the client's (500 ms by
    // default) would cut one short of a longer setting. A cluster client needs one: an hour.
    let mut b = redis::cluster::ClusterClientBuilder::new(infos)
        .response_timeout(std::time::Duration::from_secs(3600));
    if tls {
        if let Some(certs) = &opts.tls.certs {
            b = b.certs(certs.clone());
        }
        if opts.tls.skip_hostname_verification {
            b = b.danger_accept_invalid_hostnames(true);
        }
    }
    b.build()
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
