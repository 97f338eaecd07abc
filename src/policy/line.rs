//! What a grant does to the client's place in the lock's line in Redis
//! (`docs/protocol.md` 2.6): the acquire script's flag `k` or `l`.

/// Where an acquire attempt stands among its client's waiters in line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counted {
    /// Not counted: it does not wait, or waits without turns.
    No,
    /// Counted, its first attempt: it has not put the client in line, so its grant
    /// never takes the client out (an uncontended lock runs no `LREM`), and keeps it in
    /// line if other waiters of the client are counted.
    First,
    /// Counted, and answered busy before (or its busy answer may have been lost): it
    /// put the client in line.
    Waiting,
}

/// What a first grant does to the client's place in the line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Line {
    /// Other waiters of the client remain: it stays in line, or joins it again at the
    /// back after using its turn (flag `k`).
    Keep,
    /// The attempt was the client's last waiter in line: it leaves (flag `l`).
    Leave,
    /// The client was not in line (no flag).
    Out,
}

/// The line flag of an attempt that counts as `counted`, when the client counts
/// `in_line` waiters of the name in line (this attempt included if counted) and turns
/// are on. Other waiters of the client keep it in line; the last one, if it put the
/// client there, takes it out.
pub fn grant_effect(turns: bool, in_line: u32, counted: Counted) -> Line {
    if !turns {
        return Line::Out;
    }
    let others = in_line.saturating_sub(u32::from(counted != Counted::No));
    match others {
        0 if counted == Counted::Waiting => Line::Leave,
        0 => Line::Out,
        _ => Line::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_waiter_in_line_leaves_and_a_first_attempt_stays_out() {
        assert_eq!(grant_effect(false, 3, Counted::Waiting), Line::Out);
        assert_eq!(grant_effect(true, 1, Counted::Waiting), Line::Leave);
        assert_eq!(grant_effect(true, 1, Counted::First), Line::Out);
        assert_eq!(grant_effect(true, 2, Counted::First), Line::Keep);
        assert_eq!(grant_effect(true, 2, Counted::Waiting), Line::Keep);
        assert_eq!(grant_effect(true, 1, Counted::No), Line::Keep);
        assert_eq!(grant_effect(true, 0, Counted::No), Line::Out);
    }
}
