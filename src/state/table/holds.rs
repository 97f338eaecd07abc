//! The decisions on one field's holds, each taken in one critical section of the table:
//! re-enter or send an acquire, what giving back a guard leaves to send, and whether a
//! release is the field's last and whom the lock goes to.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::{Core, Holder, InFlightGuard, Unanswered, WatchEntry, Watched};
use crate::background::Signal;
use crate::identity::Kind;
use crate::state::queue::Offer;

/// How an acquire of a field starts (see [`Core::begin_acquire`]).
pub(crate) enum Begin {
    /// Another request of the field is in flight: wait until it settles
    /// ([`Core::settled`]), then begin again.
    Wait,
    /// A live watchdog hold of the field was re-entered: nothing to send.
    Reentered(Arc<WatchEntry>),
    /// Send an acquire. `fresh`: the client holds nothing under the field and sends no
    /// other request of it (the script's flag `f`).
    Send {
        fresh: bool,
        in_flight: InFlightGuard,
        /// Releases of the field that got no answer, to be sent again first.
        unanswered: Vec<Unanswered>,
    },
}

/// What giving back one guard leaves to do (see [`Core::release_watched`]).
pub(crate) enum Handback {
    /// Another guard of the same watchdog hold remains: nothing to send.
    Local,
    /// The hold is known lost. `sweep`: no other request or hold of this client has the
    /// field, so whatever Redis still keeps under it is this lost hold's (a renewal that
    /// landed after the client gave up on the lease), and is deleted.
    Lost { sweep: Option<InFlightGuard> },
    /// Give back `holds` of the hash's count, setting `keep` as lease if holds remain.
    Send { holds: u32, keep: Option<Duration> },
}

impl Core {
    /// Starts an acquire of `(name, field)`. `reenter`: a live watchdog hold may be
    /// re-entered without a request. `waited`: the caller already waited for earlier
    /// requests of the field (as long as it may); it sends even if they are not done.
    /// `adopt`: the request follows an offer to the field whose outcome is not known, and
    /// is to adopt a hold that offer may have written.
    pub(crate) fn begin_acquire(
        self: &Arc<Self>,
        name: &Arc<str>,
        field: &Arc<str>,
        reenter: bool,
        waited: bool,
        adopt: bool,
    ) -> Begin {
        self.with_holder(name, field, |h, _| {
            // What the client knows of this field's holds is only settled once its
            // earlier requests are (see `InFlightGuard`).
            if h.in_flight > 0 && !waited {
                return Begin::Wait;
            }
            if let Some(w) = &mut h.watched {
                if reenter && w.entry.live() {
                    w.guards += 1;
                    return Begin::Reentered(w.entry.clone());
                }
            }
            // Fresh only with no other request of the field in flight, but the offer to be
            // adopted: a fresh call adopts a hold of its field that it finds, and must not
            // adopt the grant of an acquire kept unpolled past the wait (which makes a
            // guard of its own), nor a hold whose release is on its way.
            // Nor with a grant handed to a waiter of the field and not yet taken up (a
            // twin future of the task): that is its waiter's, not a hold nobody took.
            // An adopting call may overlook the offer's own mark, not a twin's request.
            let fresh = !h.holds()
                && h.handed == 0
                && (h.in_flight == 0 || (adopt && h.in_flight <= h.offering));
            self.start(h);
            Begin::Send {
                fresh,
                in_flight: self.guard(name, field),
                unanswered: h.unanswered.clone(),
            }
        })
    }

    /// Records a watchdog hold taken in Redis, confirmed until `until`.
    pub(crate) fn add_watched(
        &self,
        name: &Arc<str>,
        field: &Arc<str>,
        until: Instant,
        token: u64,
        kind: Kind,
    ) -> Arc<WatchEntry> {
        self.with_holder(name, field, |h, _| {
            h.kind = kind;
            let w = h.watched.get_or_insert_with(|| Watched {
                guards: 0,
                remote: 0,
                entry: Arc::new(WatchEntry {
                    name: name.clone(),
                    field: field.clone(),
                    lost: Signal::default(),
                    token,
                    kind,
                    valid_until: Mutex::new(until),
                    taken: Instant::now(),
                }),
            });
            w.guards += 1;
            w.remote += 1;
            w.entry.extend(until);
            if w.entry.expired() {
                // The reply was taken up after the lease it granted had run out (a future
                // left unpolled that long): the lock may be someone else's already.
                w.entry.lost.set();
            }
            w.entry.clone()
        })
    }

    /// Records a fixed-lease hold taken in Redis, whose lease ends at `expires`.
    pub(crate) fn add_fixed(
        &self,
        name: &Arc<str>,
        field: &Arc<str>,
        kind: Kind,
        expires: Instant,
    ) {
        self.with_holder(name, field, |h, _| {
            h.kind = kind;
            h.fixed += 1;
            h.fixed_until = h.fixed_until.max(Some(expires));
        });
    }

    /// Gives back one watchdog guard of `entry`; `lost`: the guard found it lost.
    pub(crate) fn release_watched(
        self: &Arc<Self>,
        entry: &Arc<WatchEntry>,
        lost: bool,
    ) -> Handback {
        self.with_holder(&entry.name, &entry.field, |h, _| {
            let ours = matches!(&h.watched, Some(w) if Arc::ptr_eq(&w.entry, entry));
            if !ours {
                // Dropped as lost (or force-unlocked) already; a newer entry is not ours.
                return Handback::Lost {
                    sweep: self.sweep(h, &entry.name, &entry.field),
                };
            }
            let w = h.watched.as_mut().expect("checked above");
            let plan = if w.guards == 1 {
                let remote = w.remote;
                h.watched = None;
                // Fixed leases left of a plain lock: the key ends with the last of them,
                // not a watchdog lease later; one already run out is given back too.
                let left = h
                    .fixed_until
                    .map(|t| t.saturating_duration_since(Instant::now()));
                match left {
                    Some(left) if h.fixed > 0 && h.kind == Kind::Plain => {
                        if left.is_zero() {
                            let holds = remote + std::mem::take(&mut h.fixed);
                            h.fixed_until = None;
                            Handback::Send { holds, keep: None }
                        } else {
                            let keep = Some(left + Duration::from_millis(1));
                            Handback::Send {
                                holds: remote,
                                keep,
                            }
                        }
                    }
                    _ => Handback::Send {
                        holds: remote,
                        keep: None,
                    },
                }
            } else if w.guards > w.remote {
                // Guards are interchangeable: one of the local re-entries ends.
                w.guards -= 1;
                Handback::Local
            } else {
                // Every guard took its hold in Redis (a fenced lock's re-entries).
                w.guards -= 1;
                w.remote -= 1;
                Handback::Send {
                    holds: 1,
                    keep: Some(self.lease),
                }
            };
            if lost {
                return Handback::Lost {
                    sweep: self.sweep(h, &entry.name, &entry.field),
                };
            }
            plan
        })
    }

    /// Gives back one fixed-lease guard whose lease ends at `expires`.
    pub(crate) fn release_fixed(
        self: &Arc<Self>,
        name: &Arc<str>,
        field: &Arc<str>,
        expires: Instant,
    ) -> Handback {
        self.with_holder(name, field, |h, _| {
            h.fixed = h.fixed.saturating_sub(1);
            if h.fixed == 0 {
                h.fixed_until = None;
            }
            // A watchdog hold of the field taken before the lease ran out has renewed the
            // key since: the fixed hold is still counted in it.
            let covered = h
                .watched
                .as_ref()
                .is_some_and(|w| w.entry.taken < expires && w.entry.live());
            if Instant::now() >= expires && !covered {
                // What the hash still counts for this field may be a newer hold of the
                // same owner, which a release must not touch.
                return Handback::Lost {
                    sweep: self.sweep(h, name, field),
                };
            }
            Handback::Send {
                holds: 1,
                keep: h.watched.is_some().then_some(self.lease),
            }
        })
    }

    /// Claims the field for a sweep if nothing else of this client uses it.
    fn sweep(
        self: &Arc<Self>,
        h: &mut Holder,
        name: &Arc<str>,
        field: &Arc<str>,
    ) -> Option<InFlightGuard> {
        if !h.unused() {
            return None;
        }
        self.start(h);
        Some(self.guard(name, field))
    }

    /// Starts a release of `(name, field)`. If the client holds nothing more under the
    /// field and `may_offer`, the name's queue is asked whom the lock goes to
    /// ([`pick`](Self::pick); `listening` as there), passing over fields with a request
    /// in flight; the offered field is in flight too until the last guard returned drops
    /// (the offer is settled). A retry of a request of that field (issue 24, finding 6:
    /// two calls of one task at once) could otherwise take a hold handed over meanwhile
    /// for its own first grant, and two guards would share one hold.
    pub(crate) fn begin_release(
        self: &Arc<Self>,
        name: &Arc<str>,
        field: &Arc<str>,
        may_offer: bool,
        listening: bool,
    ) -> (InFlightGuard, Offer, Option<OfferedGuard>) {
        self.with(name, |e| {
            let holds = {
                let h = e.holders.entry(field.clone()).or_default();
                self.start(h);
                h.holds()
            };
            // Holds this client still counts for the field make the release partial:
            // offering the lock with it would only wake a waiter for nothing.
            let plan = if may_offer && !holds {
                let holders = &e.holders;
                // Nor to a field with a release that got no answer: its resend, before
                // the field's next call, must not meet a hold handed over meanwhile.
                let busy = |f: &str| {
                    holders
                        .get(f)
                        .is_some_and(|h| h.in_flight > 0 || !h.unanswered.is_empty())
                };
                self.pick(&mut e.queue, listening, &busy)
            } else {
                None
            };
            let to = match &plan {
                Some(Offer::To(ticket, _)) => {
                    let h = e.holders.entry(ticket.field.clone()).or_default();
                    self.start(h);
                    h.offering += 1;
                    Some(OfferedGuard(self.guard(name, &ticket.field)))
                }
                _ => None,
            };
            (self.guard(name, field), plan.unwrap_or(Offer::Publish), to)
        })
    }
}

impl Core {
    /// Counts a grant handed to a waiter of `(name, field)` until the guard is dropped,
    /// once the waiter has taken it up (registered or given it back).
    pub(crate) fn handing(self: &Arc<Self>, name: &Arc<str>, field: &Arc<str>) -> HandedGuard {
        self.with_holder(name, field, |h, _| h.handed += 1);
        HandedGuard {
            core: self.clone(),
            name: name.clone(),
            field: field.clone(),
        }
    }
}

/// A grant handed to a waiter and not yet taken up (see [`Core::handing`]): while it
/// lives, calls of the field are not sent as knowing of no hold.
pub(crate) struct HandedGuard {
    core: Arc<Core>,
    name: Arc<str>,
    field: Arc<str>,
}

impl Drop for HandedGuard {
    fn drop(&mut self) {
        self.core.with_holder(&self.name, &self.field, |h, _| {
            h.handed = h.handed.saturating_sub(1);
        });
    }
}

impl Core {
    /// Records a release of `(name, field)` that got no answer (see [`Unanswered`](super::Unanswered)).
    pub(crate) fn add_unanswered(&self, name: &Arc<str>, field: &Arc<str>, u: Unanswered) {
        self.with_holder(name, field, |h, _| h.unanswered.push(u));
    }

    /// The releases of `(name, field)` that got no answer, still recorded: each stays
    /// until [`settle_unanswered`](Self::settle_unanswered), so that a caller that leaves
    /// while sending one again loses none.
    pub(crate) fn unanswered(&self, name: &Arc<str>, field: &Arc<str>) -> Vec<Unanswered> {
        self.peek(name, field, |h| h.unanswered.clone())
            .unwrap_or_default()
    }

    /// Forgets the unanswered release with this latch: a retry of it was answered.
    pub(crate) fn settle_unanswered(&self, name: &Arc<str>, field: &Arc<str>, latch: &str) {
        self.with_holder(name, field, |h, _| {
            h.unanswered.retain(|u| u.latch != latch)
        });
    }
}

/// The mark that keeps an offered field in flight until its offer settles (see
/// [`Core::begin_release`]); an adopting call of the field may overlook it.
pub(crate) struct OfferedGuard(InFlightGuard);

impl Drop for OfferedGuard {
    fn drop(&mut self) {
        let g = &self.0;
        g.core.with_holder(&g.name, &g.field, |h, _| {
            h.offering = h.offering.saturating_sub(1);
        });
    }
}
