//! The blocking client's builder: the async builder's settings, finished by a `build`
//! that blocks.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::{check_can_block, Client, Runtime};
use crate::config::{ReplicaSync, ShardedPubSub};
use crate::error::Result;

/// Builds a [`blocking::Client`](Client) with non-default settings: the settings of
/// [`crate::ClientBuilder`], and a [`build`](Self::build) that blocks.
///
/// Made by [`Client::builder`], or from any async builder (Sentinel, Cluster, an
/// existing redis-rs client) with `From`:
///
/// ```no_run
/// # fn demo() -> redis_rlock::Result<()> {
/// use std::time::Duration;
/// use redis_rlock::blocking::{Client, ClientBuilder};
/// let client = Client::builder("redis://127.0.0.1:6379")
///     .watchdog_timeout(Duration::from_secs(10))
///     .build()?;
/// let sentinel = ClientBuilder::from(redis_rlock::Client::sentinel(
///     &["redis://127.0.0.1:26379"],
///     "mymaster",
/// ))
/// .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ClientBuilder {
    inner: crate::api::client::ClientBuilder,
}

impl From<crate::api::client::ClientBuilder> for ClientBuilder {
    fn from(inner: crate::api::client::ClientBuilder) -> ClientBuilder {
        ClientBuilder { inner }
    }
}

/// Forwards setters to the async builder, each documented as the one it forwards to.
macro_rules! forward {
    ($( $(#[$attr:meta])* $name:ident($($arg:ident: $ty:ty),*); )*) => {$(
        #[doc = concat!("As [`crate::ClientBuilder::", stringify!($name), "`].")]
        $(#[$attr])*
        pub fn $name(self, $($arg: $ty),*) -> Self {
            ClientBuilder { inner: self.inner.$name($($arg),*) }
        }
    )*};
}

impl ClientBuilder {
    forward! {
        watchdog_timeout(timeout: Duration);
        name(name: impl Into<String>);
        connect_timeout(timeout: Duration);
        response_timeout(timeout: Duration);
        replica_sync(sync: ReplicaSync);
        sharded_pubsub(mode: ShardedPubSub);
        map_address(from: (&str, u16), to: (&str, u16));
        retry_window(window: Duration);
        handover_limit(limit: u32);
        handover_window(window: Duration);
        turn_window(window: Duration);
        fair_lock_wait_timeout(timeout: Duration);
        #[cfg(feature = "tls-rustls")]
        tls_root_cert(pem: impl AsRef<[u8]>);
        #[cfg(feature = "tls-rustls")]
        tls_client_cert(cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>);
    }

    /// Checks the settings and connects, blocking the calling thread, as
    /// [`crate::ClientBuilder::build`] does; the client runs on a small runtime of its
    /// own (see [`blocking`](crate::api::blocking), *Runtime*).
    ///
    /// # Errors
    ///
    /// As [`crate::ClientBuilder::build`]; [`Error::BlockingNotAllowed`](crate::Error::BlockingNotAllowed)
    /// on a thread that drives a current-thread tokio runtime (nothing was sent);
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) if the runtime cannot be
    /// started.
    ///
    /// # Panics
    ///
    /// Only where tokio forbids blocking in a way this crate cannot see (see
    /// [`blocking`](crate::api::blocking), *Threads*).
    pub fn build(self) -> Result<Client> {
        check_can_block()?;
        let runtime = Arc::new(Runtime::start()?);
        let inner = runtime.run(self.inner.build())?;
        Ok(Client { inner, runtime })
    }

    /// As [`build`](Self::build), on `runtime` instead of a runtime of the client's
    /// own; the client's background work (watchdog, pub/sub) runs there, so it must
    /// keep running while the client is used (see [`blocking`](crate::api::blocking),
    /// *Runtime*).
    ///
    /// # Errors
    ///
    /// As [`crate::ClientBuilder::build`]; [`Error::BlockingNotAllowed`](crate::Error::BlockingNotAllowed)
    /// on a thread that drives a current-thread tokio runtime.
    ///
    /// # Panics
    ///
    /// As [`build`](Self::build).
    pub fn build_on(self, runtime: Handle) -> Result<Client> {
        let runtime = Arc::new(Runtime {
            handle: runtime,
            owned: None,
        });
        let inner = runtime.run(self.inner.build())?;
        Ok(Client { inner, runtime })
    }
}

impl crate::api::client::ClientBuilder {
    /// The old name of [`blocking::ClientBuilder::build`](ClientBuilder::build), kept so
    /// that code written for it still builds.
    ///
    /// # Errors
    ///
    /// As [`blocking::ClientBuilder::build`](ClientBuilder::build).
    ///
    /// # Panics
    ///
    /// As [`blocking::ClientBuilder::build`](ClientBuilder::build).
    #[deprecated(
        since = "0.1.0",
        note = "use `blocking::Client::builder(url).build()`, or `blocking::ClientBuilder::from(builder).build()`"
    )]
    pub fn build_blocking(self) -> Result<Client> {
        ClientBuilder::from(self).build()
    }

    /// The old name of [`blocking::ClientBuilder::build_on`](ClientBuilder::build_on).
    ///
    /// # Errors
    ///
    /// As [`blocking::ClientBuilder::build_on`](ClientBuilder::build_on).
    ///
    /// # Panics
    ///
    /// As [`blocking::ClientBuilder::build_on`](ClientBuilder::build_on).
    #[deprecated(
        since = "0.1.0",
        note = "use `blocking::ClientBuilder::from(builder).build_on(runtime)`"
    )]
    pub fn build_blocking_on(self, runtime: Handle) -> Result<Client> {
        ClientBuilder::from(self).build_on(runtime)
    }
}
