//! Rules over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`): a client of the management server's
//! Aggregated Discovery Service, state of the world, subscribed to every
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` (as envoyproxy/ratelimit's
//! `xds_grpc_sotw_provider.go` is). Each response is the whole rule set, one resource a domain:
//! it is converted to the files' model (`convert.rs`), then validated, compiled and swapped in
//! exactly as a file reload is (`sources/mod.rs`, off the serving threads), and ACKed; a set that
//! fails is NACKed with every error and the rules in force stay. A broken stream is retried with backoff, forever, until
//! the service stops; nothing here panics or ends the process.
//!
//! Readiness is not decided here: the client publishes how many domains the set in force has
//! (`None` until one is accepted) and `lib.rs` turns that into readiness and gRPC health.
//!
//! Files: this one (settings, the stream, ACK/NACK, backoff), `convert.rs` (proto → model),
//! `connect.rs` (the channel, plain or TLS).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{node::UserAgentVersionType, Node};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::rls::RateLimiter;
use crate::rules::CompileOptions;
use crate::sources::{self, ReloadStatus};

pub mod connect;
pub mod convert;

pub use connect::ConnectError;
pub use convert::TYPE_URL;

/// Where the rules come from and how to reach the management server (the reference's
/// `CONFIG_GRPC_XDS_*` variables).
#[derive(Clone, PartialEq, Eq)]
pub struct XdsSettings {
    /// `host:port` of the management server (`CONFIG_GRPC_XDS_SERVER_URL`).
    pub server_url: String,
    /// The node id the server keys its snapshots by (`CONFIG_GRPC_XDS_NODE_ID`).
    pub node_id: String,
    /// String metadata of the node, `key=value` pairs (`CONFIG_GRPC_XDS_NODE_METADATA`).
    pub node_metadata: Vec<(String, String)>,
    /// Headers sent with the stream, e.g. a token (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// The first wait before reconnecting; it doubles per failed attempt
    /// (`CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`).
    pub retry_interval: Duration,
    /// The longest wait between attempts (`XDS_CLIENT_BACKOFF_MAX_INTERVAL`).
    pub retry_max: Duration,
    /// The largest response accepted, in bytes (`XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`).
    pub max_message_bytes: Option<usize>,
    /// TLS to the management server, when on (`CONFIG_GRPC_XDS_SERVER_USE_TLS`).
    pub tls: Option<XdsTls>,
    /// Ready before the first set arrives (`FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub force_start: bool,
    /// Ready only while the set in force has a domain
    /// (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub need_a_domain: bool,
}

impl std::fmt::Debug for XdsSettings {
    // The headers may carry credentials: only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("XdsSettings")
            .field("server_url", &self.server_url)
            .field("node_id", &self.node_id)
            .field("node_metadata", &self.node_metadata)
            .field("headers", &headers)
            .field("retry_interval", &self.retry_interval)
            .field("retry_max", &self.retry_max)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("tls", &self.tls)
            .field("force_start", &self.force_start)
            .field("need_a_domain", &self.need_a_domain)
            .finish()
    }
}

/// TLS to the management server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// The client certificate chain (PEM), for a server that asks for one
    /// (`CONFIG_GRPC_XDS_CLIENT_TLS_CERT`).
    pub client_cert: Option<PathBuf>,
    /// Its key (`CONFIG_GRPC_XDS_CLIENT_TLS_KEY`).
    pub client_key: Option<PathBuf>,
    /// The CA bundle the server must chain to; unset, the system's roots
    /// (`CONFIG_GRPC_XDS_SERVER_TLS_CACERT`).
    pub server_ca: Option<PathBuf>,
    /// The name the server's certificate must carry, instead of the URL's host
    /// (`CONFIG_GRPC_XDS_SERVER_TLS_SAN`).
    pub server_san: Option<String>,
}

/// The xDS client's part in the service: what it updates.
#[derive(Debug, Clone)]
pub struct XdsClient {
    /// The settings.
    pub settings: XdsSettings,
    /// How the sets are read: resources that share a domain merged
    /// (`MERGE_DOMAIN_CONFIG`), the algorithm of limits that name none.
    pub rules: CompileOptions,
    /// Where accepted sets go.
    pub limiter: Arc<RateLimiter>,
    /// What the loads did, for `/readyz` and `/rlconfig/status`.
    pub status: Arc<ReloadStatus>,
}

/// Why one stream ended. Every one is followed by a reconnect.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("the stream failed: {0}")]
    Status(#[from] tonic::Status),
    #[error("the management server closed the stream")]
    Closed,
}

// === impl XdsClient ===

impl XdsClient {
    /// Runs the client until `stop`: connects, applies every response, reconnects with
    /// backoff. `loaded` gets the domain count of every accepted set.
    pub async fn run(self, loaded: watch::Sender<Option<usize>>, stop: CancellationToken) {
        let node = node(&self.settings);
        let mut accepted = String::new();
        let mut delay = self.settings.retry_interval;
        loop {
            let mut progress = false;
            let Err(ended) = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.stream(&node, &mut accepted, &mut progress, &loaded) => r,
            };
            // A stream that got as far as a response was healthy: start the backoff over.
            if progress {
                delay = self.settings.retry_interval;
            }
            match ended {
                StreamError::Connect(e) => tracing::warn!(
                    error = %e, url = %self.settings.server_url, retry_in = ?delay,
                    "cannot reach the xDS management server"
                ),
                e => tracing::warn!(
                    error = %e, url = %self.settings.server_url, retry_in = ?delay,
                    "xDS stream ended"
                ),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(self.settings.retry_max.max(self.settings.retry_interval));
        }
    }

    /// One stream: subscribe, then answer every response with an ACK or a NACK. It only
    /// ever ends with an error: the server has no reason to close a subscription.
    async fn stream(
        &self,
        node: &Node,
        accepted: &mut String,
        progress: &mut bool,
        loaded: &watch::Sender<Option<usize>>,
    ) -> Result<std::convert::Infallible, StreamError> {
        let channel = connect::channel(&self.settings).await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(max) = self.settings.max_message_bytes {
            client = client.max_decoding_message_size(max);
        }
        // The request side: one subscription, then one ACK/NACK per response. Two slots are
        // enough, as each is sent only after the previous response was handled.
        let (tx, rx) = mpsc::channel(2);
        // The last accepted version, so a server that has nothing newer need not resend.
        let _ = tx.send(request(node, accepted, "", None)).await;
        let mut call = tonic::Request::new(ReceiverStream::new(rx));
        for (name, value) in &self.settings.headers {
            // Names and values were checked when the settings were read.
            if let (Ok(k), Ok(v)) = (
                tonic::metadata::MetadataKey::from_bytes(name.as_bytes()),
                value.parse(),
            ) {
                call.metadata_mut().insert(k, v);
            }
        }
        tracing::info!(url = %self.settings.server_url, node = %node.id, "xDS stream open");
        let mut responses = client.stream_aggregated_resources(call).await?.into_inner();
        while let Some(response) = responses.message().await? {
            *progress = true;
            let reply = self.apply(response, node, accepted, loaded).await;
            if tx.send(reply).await.is_err() {
                break;
            }
        }
        Err(StreamError::Closed)
    }

    /// Applies one response and returns its ACK (or NACK). The conversion and compile run
    /// off the serving threads, as a file reload's do ([`sources::load_and_swap`]).
    async fn apply(
        &self,
        mut response: DiscoveryResponse,
        node: &Node,
        accepted: &mut String,
        loaded: &watch::Sender<Option<usize>>,
    ) -> DiscoveryRequest {
        let result = if response.type_url == TYPE_URL {
            let resources = std::mem::take(&mut response.resources);
            let options = self.rules;
            sources::load_and_swap(&self.limiter, move || {
                convert::compile_resources(&resources, options)
            })
            .await
            .map_err(|errors| errors.iter().map(ToString::to_string).collect())
        } else {
            Err(vec![format!(
                "the response's type '{}' is not {TYPE_URL}",
                response.type_url
            )])
        };
        match result {
            Ok(set) => {
                tracing::info!(
                    version = %response.version_info,
                    rules = set.rules,
                    domains = set.domains,
                    "rules loaded over xDS"
                );
                self.status.count_success(&self.limiter);
                accepted.clone_from(&response.version_info);
                loaded.send_replace(Some(set.domains));
                request(node, accepted, &response.nonce, None)
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!(
                        version = %response.version_info, error = %e,
                        "rules over xDS rejected; the rules in force stay"
                    );
                }
                let detail = errors.join("\n");
                self.status.count_failure(&self.limiter, errors);
                request(node, accepted, &response.nonce, Some(detail))
            }
        }
    }
}

/// A DiscoveryRequest for every `RateLimitConfig` (no names: the wildcard subscription). An
/// ACK carries the version just accepted; a NACK the last one accepted and the errors.
fn request(node: &Node, version: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.to_string(),
        node: Some(node.clone()),
        type_url: TYPE_URL.to_string(),
        response_nonce: nonce.to_string(),
        error_detail: error.map(|message| envoy_types::pb::google::rpc::Status {
            code: tonic::Code::InvalidArgument as i32,
            message,
            details: Vec::new(),
        }),
        ..DiscoveryRequest::default()
    }
}

/// The node sluice presents: the configured id and metadata (string values, as the
/// reference sends them), and sluice's name and version.
fn node(settings: &XdsSettings) -> Node {
    let fields = settings
        .node_metadata
        .iter()
        .map(|(k, v)| {
            let value = Value {
                kind: Some(Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: settings.node_id.clone(),
        metadata: Some(Struct { fields }),
        user_agent_name: "sluice".to_string(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_string(),
        )),
        ..Node::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::ratelimit::config::ratelimit::v3 as pb;
    use prost::Message as _;

    use super::*;

    fn settings() -> XdsSettings {
        XdsSettings {
            server_url: "127.0.0.1:1".into(),
            node_id: "n".into(),
            node_metadata: Vec::new(),
            headers: Vec::new(),
            retry_interval: Duration::from_secs(1),
            retry_max: Duration::from_secs(1),
            max_message_bytes: None,
            tls: None,
            force_start: false,
            need_a_domain: false,
        }
    }

    /// One domain of `n` rules, exact and wildcard values.
    fn large_set(n: usize) -> DiscoveryResponse {
        let descriptors = (0..n)
            .map(|i| pb::RateLimitDescriptor {
                key: "host".into(),
                value: if i % 2 == 0 {
                    format!("h{i}")
                } else {
                    format!("*.h{i}.example.com")
                },
                rate_limit: Some(pb::RateLimitPolicy {
                    unit: pb::RateLimitUnit::Minute as i32,
                    requests_per_unit: 100,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let config = pb::RateLimitConfig {
            name: "big".into(),
            domain: "big".into(),
            descriptors,
        };
        DiscoveryResponse {
            version_info: "1".into(),
            type_url: TYPE_URL.into(),
            nonce: "a".into(),
            resources: vec![Any {
                type_url: TYPE_URL.into(),
                value: config.encode_to_vec(),
            }],
            ..DiscoveryResponse::default()
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn other_tasks_run_while_a_large_set_compiles() {
        let clock = Arc::new(crate::core::clock::ManualClock::new(
            crate::core::clock::UnixMillis(0),
        ));
        let limiter = RateLimiter::local(
            "domain: d\ndescriptors: []\n",
            clock,
            crate::rls::Options::default(),
        )
        .unwrap();
        let client = XdsClient {
            settings: settings(),
            rules: CompileOptions::default(),
            limiter: limiter.clone(),
            status: Arc::new(ReloadStatus::default()),
        };
        let (loaded, _) = watch::channel(None);
        let mut accepted = String::new();
        let response = large_set(20_000);
        // One runtime thread: a counter task runs during the apply only if the apply gives
        // the thread back while the set converts and compiles.
        let applying = Arc::new(AtomicBool::new(true));
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let (applying, ticks) = (applying.clone(), ticks.clone());
            async move {
                while applying.load(Ordering::Relaxed) {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        });
        let ack = client
            .apply(response, &node(&client.settings), &mut accepted, &loaded)
            .await;
        let during = ticks.load(Ordering::Relaxed);
        applying.store(false, Ordering::Relaxed);
        ticker.await.unwrap();
        assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
        assert_eq!(accepted, "1");
        assert_eq!(limiter.rules().rules.rules().len(), 20_000);
        assert!(
            during > 0,
            "the runtime's only thread was held for the whole apply"
        );
    }
}
