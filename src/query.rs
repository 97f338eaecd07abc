//! Reading a lock's state without taking it: the queries of [`Lock`].

use std::time::Duration;

use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::raw::{self, Kind};

impl Lock {
    /// Whether anyone holds the lock now. One round trip, bounded by the response
    /// timeout. A hash of other fields at the name is no lock: it answers
    /// [`Error::NotALock`], not `true`. For a half of a read-write lock, whether the lock is held in that half's
    /// mode (as Redisson's: `read().is_locked()` is false while a writer holds it).
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
        let mode = match target.kind {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Plain | Kind::Fair => {
                let reply = raw::query(
                    &target.inner().conn,
                    &target.name,
                    redis::cmd("HKEYS").arg(&*target.name).clone(),
                )
                .await?;
                let fields: Vec<String> =
                    redis::from_redis_value(reply).map_err(|e| Error::Redis(e.into()))?;
                return held_by_fields(&target.name, &fields);
            }
        };
        let reply = raw::query(
            &target.inner().conn,
            &target.name,
            redis::cmd("HGET").arg(&*target.name).arg("mode").clone(),
        )
        .await?;
        let held: Option<String> =
            redis::from_redis_value(reply).map_err(|e| Error::Redis(e.into()))?;
        Ok(held.as_deref() == Some(mode))
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
            .table
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

/// Whether a lock hash with these fields is held: `Ok(false)` when there are none, and
/// [`Error::NotALock`] when they are not a lock's.
fn held_by_fields(name: &str, fields: &[String]) -> Result<bool> {
    let holders = fields.iter().filter(|f| raw::is_holder_field(f)).count();
    let others = fields.iter().filter(|f| *f != "mode").count() - holders;
    match (fields.is_empty(), holders > 0 && others == 0) {
        (true, _) => Ok(false),
        (false, true) => Ok(true),
        (false, false) => Err(Error::NotALock {
            key: name.to_string(),
        }),
    }
}
