//! What every lock call acts on: the client's shared services and one lock's keys, and
//! the limits its inputs are checked against.

use std::sync::Arc;

use crate::config::MAX_NAME_LEN;
use crate::error::{Error, Result};
use crate::identity::{holder_field, Kind, OwnerId};
use crate::shell::services::ClientInner;
use crate::wire::raw;

thread_local! {
    /// The last holder field made on this thread, with the owner, kind and client id
    /// length it was made for; the client is told by the field's prefix, its id.
    #[allow(clippy::type_complexity)]
    static LAST_FIELD: std::cell::RefCell<Option<(OwnerId, Kind, usize, Arc<str>)>> =
        const { std::cell::RefCell::new(None) };
}

/// One lock of one client: what [`Lock`](crate::Lock) wraps and every guard keeps.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) inner: Arc<ClientInner>,
    pub(crate) name: Arc<str>,
    pub(crate) channel: Arc<str>,
    pub(crate) token_key: Arc<str>,
    /// A fenced lock: every acquisition draws a token (Redisson's `RFencedLock`).
    pub(crate) fenced: bool,
    pub(crate) kind: Kind,
}

impl Target {
    pub(crate) fn new(inner: Arc<ClientInner>, name: String, fenced: bool, kind: Kind) -> Target {
        let channel = kind.channel(&name);
        let token_key = raw::token_key(&name).into();
        Target {
            inner,
            name: name.into(),
            channel: channel.into(),
            token_key,
            fenced: fenced && kind == Kind::Plain,
            kind,
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
        (owner, self.field_of(owner))
    }

    /// The holder field `owner` writes in the hash: Redisson's write lock marks its own.
    pub(crate) fn field_of(&self, owner: OwnerId) -> Arc<str> {
        let id = &*self.inner().id;
        // The field of this thread's last call, if it is this one's: a task's lock and
        // unlock pairs ask for the same field over and over, and building it (two
        // allocations and a format) was a tenth of what the client adds to a pair.
        let cached = LAST_FIELD.with(|last| {
            let last = last.borrow();
            let (o, k, id_len, field) = last.as_ref()?;
            (*o == owner && *k == self.kind && *id_len == id.len() && field.starts_with(id))
                .then(|| field.clone())
        });
        if let Some(field) = cached {
            return field;
        }
        let field = holder_field(id, owner);
        let field: Arc<str> = match self.kind {
            Kind::Write => format!("{field}:write").into(),
            Kind::Plain | Kind::Read | Kind::Fair => field.into(),
        };
        LAST_FIELD
            .with(|last| *last.borrow_mut() = Some((owner, self.kind, id.len(), field.clone())));
        field
    }

    pub(crate) fn hold(&self, field: &Arc<str>) -> Hold {
        Hold {
            name: self.name.clone(),
            channel: self.channel.clone(),
            token_key: self.token_key.clone(),
            field: field.clone(),
            fenced: self.fenced,
            kind: self.kind,
        }
    }
}

pub(crate) use crate::wire::raw::ATTEMPTS;

/// What identifies one hold on the server.
#[derive(Clone)]
pub(crate) struct Hold {
    pub(crate) name: Arc<str>,
    pub(crate) channel: Arc<str>,
    pub(crate) token_key: Arc<str>,
    pub(crate) field: Arc<str>,
    pub(crate) fenced: bool,
    pub(crate) kind: Kind,
}
