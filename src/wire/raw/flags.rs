//! The flags argument of `lua/acquire.lua` and `lua/unlock.lua` (`docs/protocol.md` 2.1,
//! 2.2), and the client's place in the line that one of its letters carries.

use crate::wire::connection::Conn;

pub(crate) use crate::policy::line::Line;

/// The acquire script's letter for what a first grant does to the line.
fn line_letter(line: Line) -> Option<u8> {
    match line {
        Line::Keep => Some(b'k'),
        Line::Leave => Some(b'l'),
        Line::Out => None,
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
        match line_letter(line) {
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
