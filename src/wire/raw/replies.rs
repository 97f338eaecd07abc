//! The acquire and unlock scripts' replies, decoded as redis-rs decodes any reply
//! (`FromRedisValue`).

use redis::{FromRedisValue, ParsingError, Value};

/// The acquire script's reply, as Redis sent it.
pub(super) enum AcquireReply {
    /// `{1, token, latched}`, or nil for a plain lock's fresh first grant (`{1, 0, 0}`).
    Granted { token: i64, latched: bool },
    /// `{0, pttl}`.
    Busy(i64),
    /// `{0, pttl, 1}`: free, but another client's turn, which ends in `pttl` ms.
    TurnBusy(i64),
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> std::result::Result<Self, ParsingError> {
        let (kind, n, latched): (i64, i64, Option<i64>) = match v {
            Value::Nil => (1, 0, Some(0)),
            // `lua/take.lua`'s busy answer: the PTTL alone, as Redisson's script gives it.
            Value::Int(pttl) => (0, pttl, None),
            Value::Array(items) if (2..=3).contains(&items.len()) => {
                let mut items = items.into_iter();
                let mut next = || items.next().map(i64::from_redis_value).transpose();
                (
                    next()?.unwrap_or_default(),
                    next()?.unwrap_or_default(),
                    next()?,
                )
            }
            other => return Err(shape("acquire", &other)),
        };
        match kind {
            1 => Ok(AcquireReply::Granted {
                token: n,
                latched: latched == Some(1),
            }),
            0 if latched == Some(1) => Ok(AcquireReply::TurnBusy(n)),
            0 => Ok(AcquireReply::Busy(n)),
            _ => Err(ParsingError::from(format!(
                "acquire script answered {kind}"
            ))),
        }
    }
}

/// The unlock script's reply, as Redis sent it.
pub(super) enum UnlockReply {
    /// nil.
    NotHeld,
    /// `0`.
    StillHeld,
    /// `1`.
    Released,
    /// `{2, token}`.
    HandedOver(i64),
    /// `3`.
    GaveWay,
}

impl FromRedisValue for UnlockReply {
    fn from_redis_value(v: Value) -> std::result::Result<Self, ParsingError> {
        match v {
            Value::Nil => Ok(UnlockReply::NotHeld),
            Value::Array(items) if items.len() == 2 => {
                let mut items = items.into_iter();
                let kind = i64::from_redis_value(items.next().unwrap_or(Value::Nil))?;
                let token = i64::from_redis_value(items.next().unwrap_or(Value::Nil))?;
                match kind {
                    2 => Ok(UnlockReply::HandedOver(token)),
                    _ => Err(ParsingError::from(format!(
                        "unlock script answered {{{kind}, ..}}"
                    ))),
                }
            }
            other => match i64::from_redis_value(other)? {
                0 => Ok(UnlockReply::StillHeld),
                1 => Ok(UnlockReply::Released),
                3 => Ok(UnlockReply::GaveWay),
                n => Err(ParsingError::from(format!("unlock script answered {n}"))),
            },
        }
    }
}

fn shape(what: &str, v: &Value) -> ParsingError {
    ParsingError::from(format!("{what} script answered {v:?}"))
}
