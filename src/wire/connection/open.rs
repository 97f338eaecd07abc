//! Opening connections: every URL goes through [`open_client`], where it is checked and
//! given the client's TLS certificates, so that commands, pub/sub, sentinels and cluster
//! nodes all connect alike.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, RedisError};

use super::named::{set_name, watch_disconnects, NamedManager};
use crate::config::{without_password, Config, TlsSettings};
use crate::error::{Error, Result};

pub(crate) fn manager_config(config: &Config) -> ConnectionManagerConfig {
    // One quick retry only: a request that finds the connection broken waits for the
    // reconnect, and must fail within the configured timeouts, not after a long backoff.
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
}

/// Opens a lane (see [`super::lanes`]) to the server `client` names, within the
/// client's connect and response timeouts.
pub(super) async fn open_lane(
    client: &redis::Client,
    config: &Config,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await?;
    set_name(&mut conn, &config.connection_name()).await;
    Ok(conn)
}

fn bad_url(url: &str, e: RedisError) -> Error {
    Error::InvalidConfig(format!("bad Redis URL `{}`: {e}", without_password(url)))
}

/// A client for `url` with the client's TLS settings. Every connection the crate opens
/// starts here (or at [`cluster_client`], which checks its URLs here first), so a
/// `rediss://` URL gets the same certificates wherever it is used. redis-rs reads
/// `valkey://` and `valkeys://` as `redis://` and `rediss://`, and so does every URL
/// given to this crate.
pub(crate) fn open_client(url: &str, tls: &TlsSettings) -> Result<redis::Client> {
    #[cfg(not(feature = "tls-rustls"))]
    for scheme in ["rediss://", "valkeys://"] {
        if url
            .get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
        {
            // redis-rs's own message does not say which switch is missing.
            return Err(Error::InvalidConfig(format!(
                "`{scheme}` needs TLS support: build redis-rlock with its `tls-rustls` feature"
            )));
        }
    }
    let info = url.into_connection_info().map_err(|e| bad_url(url, e))?;
    if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        if !tls.is_empty() {
            // Certificates with a plain URL would silently mean no TLS at all.
            return Err(Error::InvalidConfig(format!(
                "TLS certificates were given, but `{}` is reached over plain TCP: use a `rediss://` (or `valkeys://`) URL",
                info.addr()
            )));
        }
        return redis::Client::open(info).map_err(|e| bad_url(url, e));
    }
    #[cfg(not(feature = "tls-rustls-insecure"))]
    if matches!(
        info.addr(),
        redis::ConnectionAddr::TcpTls { insecure: true, .. }
    ) {
        // Said here, typed, rather than by redis-rs at the first connect.
        return Err(Error::InvalidConfig(format!(
            "`#insecure` (no certificate check) for `{}` needs the `tls-rustls-insecure` feature",
            info.addr()
        )));
    }
    #[cfg(feature = "tls-rustls")]
    ensure_crypto_provider();
    if tls.is_empty() {
        return redis::Client::open(info).map_err(|e| bad_url(url, e));
    }
    with_certificates(info, tls)
}

#[cfg(feature = "tls-rustls")]
fn certificates(tls: &TlsSettings) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client_cert
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.root_cert.clone(),
    }
}

#[cfg(feature = "tls-rustls")]
fn with_certificates(info: redis::ConnectionInfo, tls: &TlsSettings) -> Result<redis::Client> {
    let addr = info.addr().to_string();
    // redis-rs parses the PEM here, so bad certificates show at build, not at connect.
    redis::Client::build_with_tls(info, certificates(tls))
        .map_err(|e| Error::InvalidConfig(format!("TLS certificates for `{addr}`: {e}")))
}

#[cfg(not(feature = "tls-rustls"))]
fn with_certificates(info: redis::ConnectionInfo, _: &TlsSettings) -> Result<redis::Client> {
    Err(Error::InvalidConfig(format!(
        "TLS certificates for `{}` need the `tls-rustls` feature",
        info.addr()
    )))
}

/// redis-rs builds its rustls configurations from the process-wide crypto provider, and
/// rustls only picks one by itself when exactly one provider is compiled in: an
/// application that also links aws-lc-rs (rustls's default) would panic at the first
/// handshake. Installing ring's provider when none is installed yet is what rustls
/// itself would do with ring alone, and leaves an application's own choice alone.
#[cfg(feature = "tls-rustls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is there either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Whether `e` is a failed TLS handshake or certificate check (rustls's error, which
/// redis-rs hands on wrapped in an I/O error).
#[cfg(feature = "tls-rustls")]
pub(super) fn is_tls_failure(e: &RedisError) -> bool {
    use std::error::Error as _;
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(err) = next {
        if err.is::<rustls::Error>() {
            return true;
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if inner.is::<rustls::Error>() {
                return true;
            }
        }
        // An `Arc`'s `source` skips the error it holds, so look inside it first.
        next = match err.downcast_ref::<Shared>() {
            Some(inner) => Some(&**inner),
            None => err.source(),
        };
    }
    false
}

/// Classifies an error met while connecting or on the first command. A failed TLS
/// handshake (an unknown CA, a missing or refused client certificate) will fail the
/// same way on every retry, so it is a configuration error, not an outage. A server that
/// accepts and never answers is as unreachable as one that refuses, and the error names
/// it: a client given several URLs can then tell which one hangs.
pub(crate) fn connect_error(e: RedisError, timeout: Duration, addr: &str) -> Error {
    #[cfg(feature = "tls-rustls")]
    if is_tls_failure(&e) {
        return Error::InvalidConfig(format!(
            "TLS handshake with Redis failed (check the CA and client certificate): {e}"
        ));
    }
    if e.is_timeout() {
        return Error::Unavailable {
            addr: addr.to_string(),
            source: e,
        };
    }
    Error::from_redis(e, "", timeout, addr)
}

/// The error of a connect that ran out of its whole `limit`, naming the server.
pub(super) fn connect_timed_out(limit: Duration, addr: &str) -> Error {
    let io = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no connection within {limit:?}"),
    );
    Error::Unavailable {
        addr: addr.to_string(),
        source: io.into(),
    }
}

/// The server `client` talks to, as an error names it (`host:port`, no credentials).
pub(crate) fn addr_of(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// The servers behind `urls`, as an error names them: `host:port` each (never the
/// password a URL may hold), comma separated.
#[cfg(feature = "cluster")]
pub(crate) fn addrs_of(urls: &[String]) -> String {
    urls.iter()
        .map(|u| match u.as_str().into_connection_info() {
            Ok(info) => info.addr().to_string(),
            Err(_) => without_password(u),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Opens the command connection to the server `client` names, named as
/// [`super::named`] says.
pub(super) async fn connect_manager(
    client: redis::Client,
    config: &Config,
) -> Result<NamedManager> {
    // The connect, then the greeting and the name: the manager's one retry of a first
    // attempt that broke fast fits in it, one that hung does not.
    let limit = config.connect_timeout + config.response_timeout;
    let addr = addr_of(&client);
    let unnamed = Arc::new(AtomicBool::new(false));
    let mut manager_config = manager_config(config);
    // Only RESP3 has disconnect pushes; redis-rs refuses a push sender without them.
    if client
        .get_connection_info()
        .redis_settings()
        .protocol()
        .supports_resp3()
    {
        manager_config = manager_config.set_push_sender(watch_disconnects(unnamed.clone()));
    }
    let connect = async {
        let manager = ConnectionManager::new_with_config(client, manager_config).await?;
        Ok(NamedManager::new(manager, config.connection_name(), unnamed).await)
    };
    tokio::time::timeout(limit, connect)
        .await
        .map_err(|_| connect_timed_out(limit, &addr))?
        .map_err(|e| connect_error(e, config.connect_timeout, &addr))
}

#[cfg(feature = "cluster")]
/// Builds a cluster client for `nodes`; `push` makes it a RESP3 client whose pushes go
/// to the given channel (used by the pub/sub hub).
pub(crate) fn cluster_client(
    nodes: &[String],
    config: &Config,
    push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
) -> Result<redis::cluster::ClusterClient> {
    for url in nodes {
        open_client(url, &config.tls)?;
    }
    let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.response_timeout)
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(200);
    // The seeds' scheme (checked above) already turns TLS on for every node the cluster
    // reports; the certificates have to be handed over separately.
    #[cfg(feature = "tls-rustls")]
    if !config.tls.is_empty() {
        builder = builder.certs(certificates(&config.tls));
    }
    if let Some(tx) = push {
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx);
    }
    builder
        .build()
        .map_err(|e| Error::InvalidConfig(format!("bad cluster configuration: {e}")))
}

/// A connection of `client` with every node connection it has so far named (redis-rs
/// sends `CLIENT SETNAME` to all nodes). One it opens later on its own is not.
#[cfg(feature = "cluster")]
pub(crate) async fn connect_cluster(
    client: &redis::cluster::ClusterClient,
    name: &str,
) -> redis::RedisResult<redis::cluster_async::ClusterConnection> {
    let mut conn = client.get_async_connection().await?;
    set_name(&mut conn, name).await;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_config(r: Result<redis::Client>) -> String {
        match r {
            Err(Error::InvalidConfig(m)) => m,
            Err(e) => panic!("expected InvalidConfig, got {e:?}"),
            Ok(_) => panic!("expected InvalidConfig, got a client"),
        }
    }

    #[test]
    fn a_bad_url_is_reported_without_its_password() {
        let m = invalid_config(open_client(
            "redis://user:s3cret@127.0.0.1:notaport",
            &TlsSettings::default(),
        ));
        assert!(!m.contains("s3cret"), "{m}");
        assert!(m.contains("user:***@127.0.0.1"), "{m}");
        assert_eq!(
            without_password("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(without_password("redis://:pw@h:1"), "redis://:***@h:1");
    }

    #[test]
    fn tls_settings_are_checked_against_the_url() {
        let none = TlsSettings::default();
        assert!(open_client("redis://127.0.0.1:6379", &none).is_ok());
        let roots = TlsSettings {
            root_cert: Some(b"anything".to_vec()),
            client_cert: None,
        };
        let m = invalid_config(open_client("redis://127.0.0.1:6379", &roots));
        assert!(m.contains("rediss://"), "{m}");
        #[cfg(not(feature = "tls-rustls"))]
        {
            let m = invalid_config(open_client("REDISS://127.0.0.1:6379", &none));
            assert!(m.contains("tls-rustls"), "{m}");
        }
        #[cfg(all(feature = "tls-rustls", not(feature = "tls-rustls-insecure")))]
        {
            let m = invalid_config(open_client("rediss://127.0.0.1:6379/#insecure", &none));
            assert!(m.contains("tls-rustls-insecure"), "{m}");
        }
    }
}
