//! Unit tests of the hand-over queue and its offers.
use super::*;
use crate::policy::run::Limits;
use crate::policy::run::{RUN_GAP_MAX, RUN_GAP_SHARE, RUN_WINDOWS};
use crate::state::queue::Grant;

fn hub(limit: u32) -> Arc<Core> {
    hub_with(limit, Duration::from_secs(3600))
}

fn hub_with(limit: u32, window: Duration) -> Arc<Core> {
    core(limit, window, false)
}

fn core(limit: u32, window: Duration, asks_at_end: bool) -> Arc<Core> {
    let limits = Limits {
        limit,
        window,
        asks_at_end,
    };
    Arc::new(Core::new(Duration::from_secs(30), limits))
}

fn to(o: Offer) -> Arc<Ticket> {
    match o {
        Offer::To(t, _) => t,
        _ => panic!("expected an offer"),
    }
}

fn grant(token: u64) -> Grant {
    Grant {
        token,
        sent: Instant::now(),
        unacked: false,
    }
}

/// `n` waiters of `name`, fields `f0`, `f1`, ..., in first-wait order, not parked yet.
fn waiters(h: &Arc<Core>, name: &Arc<str>, n: usize) -> Vec<Waiter> {
    (0..n)
        .map(|i| h.waiter(name, &format!("f{i}").into(), Duration::from_secs(1), false))
        .collect()
}

/// `n` waiters of `name`, parked in first-wait order.
fn parked(h: &Arc<Core>, name: &Arc<str>, n: usize) -> Vec<Waiter> {
    let ws = waiters(h, name, n);
    for w in &ws {
        w.park(None);
    }
    ws
}

/// The terms of an offer; panics on anything else.
fn terms(o: Offer) -> Terms {
    match o {
        Offer::To(_, terms) => terms,
        _ => panic!("expected an offer"),
    }
}

#[tokio::test]
async fn offers_oldest_first_and_bounds_the_streak() {
    let h = hub(2);
    let name: Arc<str> = "n".into();
    let ws = waiters(&h, &name, 3);
    // Parked in reverse order; first-wait order still wins.
    for w in ws.iter().rev() {
        w.park(None);
    }
    assert_eq!(&*to(h.offer("n")).field, "f0");
    assert_eq!(&*to(h.offer("n")).field, "f1");
    assert!(
        matches!(h.offer("n"), Offer::EndStreak { .. }),
        "third in a row is published"
    );
    assert_eq!(&*to(h.offer("n")).field, "f2");
    assert!(matches!(h.offer("n"), Offer::Publish), "nobody left");
    assert_eq!(
        h.peek_queue("n", |q| q.run.streak()).unwrap(),
        1,
        "a run still counting is kept"
    );
    assert!(matches!(h.offer("other"), Offer::Publish));
}

#[tokio::test]
async fn grant_reaches_waiter_or_comes_back() {
    let h = hub(4);
    let name: Arc<str> = "n".into();
    let w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    let t = to(h.offer("n"));
    assert_eq!(w.unpark(), Woke::Offered);
    assert!(t.deliver(grant(7), Box::new(())));
    assert!(matches!(w.outcome().await, Woke::Granted(g) if g.token == 7));

    // Offered, then the waiter leaves: the unlocker keeps the grant.
    w.park(None);
    let t = to(h.offer("n"));
    assert!(matches!(w.leave(), Left::Offered));
    assert!(!t.deliver(grant(8), Box::new(())));

    // Granted but never taken: the leaving waiter gets it back.
    let w = h.waiter(&name, &"g".into(), Duration::from_secs(1), false);
    w.park(None);
    let t = to(h.offer("n"));
    assert!(t.deliver(grant(9), Box::new(())));
    assert!(matches!(w.leave(), Left::Granted(g) if g.token == 9));
}

#[tokio::test]
async fn revert_frees_the_waiter() {
    let h = hub(4);
    let name: Arc<str> = "n".into();
    let w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    let t = to(h.offer("n"));
    t.revert();
    w.picked().await;
    assert_eq!(w.unpark(), Woke::Free);
    assert_eq!(w.outcome().await, Woke::Free);
    assert!(h.peek_queue("n", |q| q.sleeping.is_empty()).unwrap());
    h.offer_settled(&"n".into(), Terms::Outright, Settled::NotHandedOver);
    // Nothing left counting: the name's entry is gone.
    assert_eq!(h.peek_queue("n", |q| q.run.streak()), None);
}

#[tokio::test]
async fn a_failed_unlock_leaves_the_waiter_unsure_once() {
    let h = hub(4);
    let name: Arc<str> = "n".into();
    let w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    let t = to(h.offer("n"));
    t.unsure();
    assert_eq!(w.outcome().await, Woke::Unsure);
    // Taken: the next sleep starts afresh.
    assert_eq!(w.unpark(), Woke::Free);
    // Unsure, then the waiter leaves: nothing is handed back (nobody knows).
    w.park(None);
    let t = to(h.offer("n"));
    t.unsure();
    assert!(matches!(w.leave(), Left::Empty));
}

#[tokio::test]
async fn idle_entries_are_dropped() {
    let h = hub_with(4, Duration::from_millis(10));
    let name: Arc<str> = "n".into();
    let w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    let _t = to(h.offer("n"));
    // A run is counting: the entry stays while its window lasts.
    w.unpark();
    assert!(h.peek_queue("n", |_| ()).is_some());
    tokio::time::sleep(Duration::from_millis(20)).await;
    w.park(None);
    w.unpark();
    assert_eq!(h.len(), 0);
}

#[tokio::test]
async fn an_abandoned_offer_is_left_to_its_lease() {
    let h = hub(4);
    let name: Arc<str> = "n".into();
    let mut w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    let t = to(h.offer("n"));
    assert_eq!(w.abandon_offer(), Woke::Free);
    assert!(
        t.deliver(grant(5), Box::new(())),
        "a late grant is left to its lease"
    );
    // The fresh ticket is offered again, in the same place.
    w.park(None);
    let t = to(h.offer("n"));
    assert!(t.deliver(grant(6), Box::new(())));
    assert!(matches!(w.abandon_offer(), Woke::Granted(g) if g.token == 6));
}

#[tokio::test]
async fn zero_limit_never_offers() {
    let h = hub(0);
    let name: Arc<str> = "n".into();
    let w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    assert!(matches!(h.offer("n"), Offer::Publish));
}

#[tokio::test]
async fn newcomers_queue_behind_sleepers_while_the_lease_is_known() {
    let h = hub(4);
    let name: Arc<str> = "n".into();
    assert!(h.behind("n").is_none());
    let w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    assert!(h.behind("n").is_none(), "no lease known");
    w.unpark();
    w.park(Some(Instant::now() + Duration::from_secs(60)));
    assert!(h.behind("n").is_some());
    w.unpark();
    assert!(h.behind("n").is_none(), "nobody asleep");
    w.park(Some(Instant::now()));
    assert!(h.behind("n").is_none(), "lease run out");
}

#[tokio::test]
async fn a_streak_ends_when_its_window_has_passed() {
    let h = hub_with(100, Duration::from_millis(30));
    let name: Arc<str> = "n".into();
    let _ws = parked(&h, &name, 3);
    assert_eq!(&*to(h.offer("n")).field, "f0");
    assert_eq!(&*to(h.offer("n")).field, "f1");
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert!(matches!(h.offer("n"), Offer::EndStreak { .. }));
    assert_eq!(&*to(h.offer("n")).field, "f2", "a new streak begins");
}

#[tokio::test]
async fn holding_back_lasts_its_period() {
    let h = hub(1);
    let name: Arc<str> = "n".into();
    let w = h.waiter(&name, &"f".into(), Duration::from_secs(1), false);
    w.park(None);
    assert!(h.held_back("n").is_none());
    h.hold_back(&"n".into(), Duration::from_secs(60));
    assert!(h.held_back("n").is_some());
    h.hold_back(&"n".into(), Duration::ZERO);
    assert!(h.held_back("n").is_none());
}

#[tokio::test]
async fn a_streak_past_its_window_asks_redis_and_its_count_still_ends_it() {
    // Windows of 200 ms, so that only a stall that long between two offers could move
    // an offer past one.
    let window = Duration::from_millis(200);
    let h = core(4, window, true);
    let name: Arc<str> = "n".into();
    let _ws = parked(&h, &name, 8);
    let past = Duration::from_millis(300);
    assert_eq!(terms(h.offer("n")), Terms::Outright);
    tokio::time::sleep(past).await;
    // The window is over: the offer goes out, on terms that let Redis end the streak.
    assert_eq!(terms(h.offer("n")), Terms::EndOfStreak);
    // Redis handed over: a new window, but the count goes on.
    assert_eq!(terms(h.offer("n")), Terms::Outright);
    assert_eq!(terms(h.offer("n")), Terms::Outright);
    // Four in a row, the limit: published, whoever waits.
    assert!(matches!(h.offer("n"), Offer::EndStreak { .. }));
    assert_eq!(terms(h.offer("n")), Terms::Outright);
    tokio::time::sleep(past).await;
    assert_eq!(terms(h.offer("n")), Terms::EndOfStreak);
    // Redis published instead: the streak is over.
    h.offer_settled(&name, Terms::EndOfStreak, Settled::NotHandedOver);
    assert_eq!(terms(h.offer("n")), Terms::Outright, "a new streak");
}

#[tokio::test]
async fn a_streak_past_its_window_ends_outright_unless_the_client_listens() {
    let window = Duration::from_millis(200);
    let h = core(100, window, true);
    let name: Arc<str> = "n".into();
    let _ws = parked(&h, &name, 2);
    assert!(matches!(h.offer("n"), Offer::To(_, Terms::Outright)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Not subscribed (yet, or any more): the script's one subscriber could be another
    // client's waiter.
    assert!(matches!(
        h.with_queue(&name, |q| h.pick(q, false, &|_| false)),
        Some(Offer::EndStreak { .. })
    ));
}

#[tokio::test]
async fn a_streak_that_redis_lets_go_on_still_ends_after_its_windows() {
    let window = Duration::from_millis(50);
    let h = core(10_000, window, true);
    let name: Arc<str> = "n".into();
    let _ws = parked(&h, &name, 40);
    let began = Instant::now();
    assert!(matches!(h.offer("n"), Offer::To(_, Terms::Outright)));
    // Each window ends with an offer on which Redis hands over (nobody else waits) ...
    let ended = loop {
        tokio::time::sleep(Duration::from_millis(60)).await;
        match h.offer("n") {
            Offer::To(_, Terms::EndOfStreak) => {}
            Offer::EndStreak { gap } => break (began.elapsed(), gap),
            _ => panic!("neither asked nor ended"),
        }
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the streak never ended"
        );
    };
    // ... until RUN_WINDOWS of them have passed: then it ends, whoever waits, and leaves
    // the lock free for a share of its length, for waiters nobody can see.
    let (ended, gap) = ended;
    assert!(ended >= window * RUN_WINDOWS, "ended after {ended:?}");
    let least = (window * RUN_WINDOWS / RUN_GAP_SHARE).min(RUN_GAP_MAX);
    assert!(gap >= least, "a gap of {gap:?}");
}

/// Issue 24, finding 6: a release never offers the lock to a field with a request in
/// flight (a retry of it could take the hand-over for its own grant), and the field it
/// offers to stays in flight until the offer is settled, so that a request of that
/// field waits for it.
#[tokio::test]
async fn an_offer_passes_over_a_field_in_flight_and_holds_its_own_field() {
    let h = core(100, Duration::from_secs(3600), false);
    let table = &h;
    let name: Arc<str> = "n".into();
    let _ws = parked(&h, &name, 2);
    // A twin call of f0 has a request in flight: f1 is offered instead.
    let twin = table.begin(&name, &"f0".into());
    let (release, plan, offered) = table.begin_release(&name, &"holder".into(), true, false);
    assert_eq!(&*to(plan).field, "f1");
    assert!(offered.is_some());
    assert!(
        table.in_flight(&name, "f1"),
        "the offered field is in flight"
    );
    drop((release, offered, twin));
    assert!(!table.in_flight(&name, "f1"));
    assert!(!table.in_flight(&name, "f0"));
}

/// A run whose window ran out with nobody asleep does not end the next contention's
/// first offer, whether the name's entry was left alone since (`Core::with` finds it
/// empty) or kept by a request of another field (`pick` with nobody asleep).
#[tokio::test]
async fn a_run_left_with_nobody_asleep_does_not_end_the_next_first_offer() {
    for pinned in [false, true] {
        let h = hub_with(256, Duration::from_millis(5));
        let name: Arc<str> = "n".into();
        let ws = waiters(&h, &name, 2);
        ws[0].park(None);
        to(h.offer("n"));
        // Kept while still counting; a request in flight keeps the entry after that.
        let _pin = pinned.then(|| h.begin(&name, &"x".into()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        if pinned {
            // A release meanwhile, published with nobody asleep.
            assert!(matches!(h.offer("n"), Offer::Publish), "nobody asleep");
        }
        ws[1].park(None);
        assert!(
            matches!(h.offer("n"), Offer::To(t, Terms::Outright) if &*t.field == "f1"),
            "pinned {pinned}: a fresh run's first offer"
        );
    }
}
