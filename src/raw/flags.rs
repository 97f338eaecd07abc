//! The flags argument of `lua/acquire.lua` and `lua/unlock.lua` (`docs/protocol.md` 2.1,
//! 2.2), and the client's place in the line that one of its letters carries.

use crate::connection::Conn;

/// What a first grant does to the client's place in the line (`lua/acquire.lua`,
/// flags `k` and `l`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// Other waiters of the client remain: it stays in line, or joins it again at the
    /// back after using its turn.
    Keep,
    /// The acquisition was the client's last waiter in line: it leaves.
    Leave,
    /// The client was not in line.
    Out,
}

impl Line {
    fn letter(self) -> Option<u8> {
        match self {
            Line::Keep => Some(b'k'),
            Line::Leave => Some(b'l'),
            Line::Out => None,
        }
    }
}

/// The flags argument of `lua/acquire.lua` and `lua/unlock.lua`: one letter for each
/// that is set. One argument instead of one each: the server pays per argument.
pub(super) struct Flags {
    /// Room for every letter of either script.
    letters: [u8; 16],
    len: usize,
}

impl Flags {
    pub(super) fn new() -> Flags {
        Flags {
            letters: [0; 16],
            len: 0,
        }
    }

    pub(super) fn set(mut self, letter: u8, on: bool) -> Flags {
        if on {
            self.letters[self.len] = letter;
            self.len += 1;
        }
        self
    }

    /// `k` or `l` for the client's place in the line, nothing when it is not in it.
    pub(super) fn line(self, line: Line) -> Flags {
        match line.letter() {
            Some(letter) => self.set(letter, true),
            None => self,
        }
    }

    /// `s` when the connection publishes with `SPUBLISH`.
    pub(super) fn publish(self, conn: &Conn) -> Flags {
        self.set(b's', conn.publish_command() == "spublish")
    }
}

impl redis::ToRedisArgs for Flags {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg(&self.letters[..self.len]);
    }
}
