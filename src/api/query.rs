//! Reading a lock's state without taking it: the queries of [`Lock`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::api::lock::Lock;
use crate::error::{Error, Result};
use crate::identity::Kind;
use crate::wire::raw;

impl Lock {
    /// Whether anyone holds the lock now. One round trip, bounded by the response
    /// timeout. A hash of other fields at the name is no lock: it answers
    /// [`Error::NotALock`], not `true` (`protocol::is_lock_hash` gives the rule). For a
    /// half of a read-write lock, whether the lock is held in that half's mode (as Redisson's: `read().is_locked()` is false while a writer holds it).
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); [`Error::WrongType`] when the key is not
    /// a hash, [`Error::NotALock`] when it is a hash of other fields; transient errors as
    /// they come.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn is_locked(&self) -> Result<bool> {
        self.target().check_usable()?;
        let target = self.target();
        let reply = raw::query(
            &target.inner().conn,
            &target.name,
            redis::cmd("HGETALL").arg(&*target.name).clone(),
        )
        .await?;
        // Bytes: a field that is not UTF-8 is data, not a reason for a decoding error.
        let entries: Vec<(Vec<u8>, Vec<u8>)> = redis::from_redis_value::<BTreeMap<_, _>>(reply)
            .map_err(|e| Error::Redis(e.into()))?
            .into_iter()
            .collect();
        if entries.is_empty() {
            return Ok(false);
        }
        if !raw::is_lock_hash(&entries) {
            return Err(Error::NotALock {
                key: target.name.to_string(),
            });
        }
        let mode = entries
            .iter()
            .find(|(f, _)| f == b"mode")
            .map(|(_, v)| &v[..]);
        Ok(match target.kind {
            Kind::Read => mode == Some(b"read"),
            Kind::Write => mode == Some(b"write"),
            Kind::Plain | Kind::Fair => true,
        })
    }

    /// Whether the calling task (or thread) holds the lock.
    ///
    /// # Errors
    ///
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn is_held_by_current_task(&self) -> Result<bool> {
        Ok(self.hold_count().await? > 0)
    }

    /// How many holds the calling task (or thread) has on the lock; 0 if none. This is
    /// the hash's count plus the watchdog re-entries this client keeps locally.
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); [`Error::WrongType`] when the key is
    /// not a lock hash; transient errors as they come.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn hold_count(&self) -> Result<u32> {
        self.target().check_usable()?;
        let (_, field) = self.target().current_field();
        let local = self
            .target()
            .inner()
            .core
            .local_holds(&self.target().name, &field);
        let reply = raw::query(
            &self.target().inner().conn,
            &self.target().name,
            redis::cmd("HGET")
                .arg(&*self.target().name)
                .arg(&*field)
                .clone(),
        )
        .await?;
        let remote = redis::from_redis_value::<Option<u32>>(reply)
            .map_err(|e| Error::Redis(e.into()))?
            .unwrap_or(0);
        Ok(if remote == 0 { 0 } else { remote + local })
    }

    /// Time until the lock expires: `None` when it is not locked. A key without expiry
    /// (not written by a lease lock) reports `Duration::MAX`.
    ///
    /// # Errors
    ///
    /// Name errors as for [`lock`](Self::lock); transient errors as they come.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Panics
    ///
    /// Panics if polled outside a tokio runtime with the time driver enabled.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.target().check_usable()?;
        let reply = raw::query(
            &self.target().inner().conn,
            &self.target().name,
            redis::cmd("PTTL").arg(&*self.target().name).clone(),
        )
        .await?;
        let ms: i64 = redis::from_redis_value(reply).map_err(|e| Error::Redis(e.into()))?;
        Ok(match ms {
            -2 => None,
            ms if ms < 0 => Some(Duration::MAX),
            ms => Some(Duration::from_millis(ms as u64)),
        })
    }
}
