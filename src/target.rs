//! What every lock call acts on: the client's shared services and one lock's keys, and
//! the limits its inputs are checked against.

use std::sync::Arc;

use crate::config::MAX_NAME_LEN;
use crate::error::{Error, Result};
use crate::identity::{holder_field, OwnerId};
use crate::raw;
use crate::services::ClientInner;

/// One lock of one client: what [`Lock`](crate::Lock) wraps and every guard keeps.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) inner: Arc<ClientInner>,
    pub(crate) name: Arc<str>,
    pub(crate) channel: Arc<str>,
    pub(crate) token_key: Arc<str>,
    /// A fenced lock: every acquisition draws a token (Redisson's `RFencedLock`).
    pub(crate) fenced: bool,
}

impl Target {
    pub(crate) fn new(inner: Arc<ClientInner>, name: String, fenced: bool) -> Target {
        let channel = raw::channel_name(&name).into();
        let token_key = raw::token_key(&name).into();
        Target {
            inner,
            name: name.into(),
            channel,
            token_key,
            fenced,
        }
    }

    /// The name is usable here and the client is not shut down: checked before any call
    /// of a lock sends anything.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.check_name()?;
        self.inner.check_open()
    }

    fn check_name(&self) -> Result<()> {
        if self.name.is_empty() {
            return Err(Error::EmptyName);
        }
        if self.name.len() > MAX_NAME_LEN {
            return Err(Error::NameTooLong {
                len: self.name.len(),
                max: MAX_NAME_LEN,
            });
        }
        if self.inner().conn.is_cluster() && !raw::cluster_safe(&self.name) {
            return Err(Error::NameNotClusterSafe {
                name: self.name.to_string(),
            });
        }
        Ok(())
    }

    pub(crate) fn inner(&self) -> &Arc<ClientInner> {
        &self.inner
    }

    pub(crate) fn current_field(&self) -> (OwnerId, Arc<str>) {
        let owner = OwnerId::current();
        (owner, holder_field(&self.inner().id, owner).into())
    }

    pub(crate) fn hold(&self, field: &Arc<str>) -> Hold {
        Hold {
            name: self.name.clone(),
            channel: self.channel.clone(),
            token_key: self.token_key.clone(),
            field: field.clone(),
            fenced: self.fenced,
        }
    }
}

/// How many times one acquire or unlock is sent when its reply may have been lost
/// (timeout, broken connection).
pub(crate) const ATTEMPTS: u32 = 3;

/// What identifies one hold on the server.
#[derive(Clone)]
pub(crate) struct Hold {
    pub(crate) name: Arc<str>,
    pub(crate) channel: Arc<str>,
    pub(crate) token_key: Arc<str>,
    pub(crate) field: Arc<str>,
    pub(crate) fenced: bool,
}
