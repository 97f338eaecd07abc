//! Unit tests of the per-client table.
use super::*;

/// A table with a 5 ms run window and no hand-over.
fn core() -> Arc<Core> {
    let limits = Limits {
        limit: 0,
        window: Duration::from_millis(5),
        asks_at_end: false,
    };
    Arc::new(Core::new(Duration::from_secs(30), limits))
}

#[tokio::test]
async fn a_field_is_settled_when_its_last_request_ends() {
    let reg = core();
    let (n, f): (Arc<str>, Arc<str>) = ("n".into(), "f".into());
    let long = Duration::from_secs(60);
    reg.settled(&n, &f, long).await; // nothing in flight
    let a = reg.begin(&n, &f);
    let b = reg.begin(&n, &f);
    let waiting = {
        let (reg, n, f) = (reg.clone(), n.clone(), f.clone());
        tokio::spawn(async move { reg.settled(&n, &f, long).await })
    };
    drop(a);
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    drop(b);
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    // A request never settled stalls the field only for the limit.
    let _stuck = reg.begin(&n, &f);
    reg.settled(&n, &f, Duration::from_millis(10)).await;
}

#[tokio::test]
async fn an_entry_goes_once_nothing_is_left_in_it() {
    let t = core();
    let (n, f): (Arc<str>, Arc<str>) = ("n".into(), "f".into());
    let e = t.add_watched(
        &n,
        &f,
        Instant::now() + Duration::from_secs(30),
        0,
        Kind::Plain,
    );
    t.add_fixed(&n, &f, Kind::Plain, Instant::now() + Duration::from_secs(1));
    assert!(t.holds(&n, &f));
    assert!(matches!(
        t.begin_acquire(&n, &f, true, false, false),
        Begin::Reentered(_)
    ));
    assert_eq!(t.local_holds(&n, &f), 1);
    assert!(matches!(t.release_watched(&e, false), Handback::Local));
    // The fixed lease left sets the key's TTL to what remains of it.
    assert!(matches!(
        t.release_watched(&e, false),
        Handback::Send {
            holds: 1,
            keep: Some(k)
        } if k > Duration::ZERO && k <= Duration::from_millis(1_001)
    ));
    assert!(matches!(
        t.release_fixed(&n, &f, Instant::now() + Duration::from_secs(1)),
        Handback::Send {
            holds: 1,
            keep: None
        }
    ));
    assert_eq!(t.len(), 0, "an empty entry was kept");
    // A lost hold's field is swept only when nothing else uses it.
    let e = t.add_watched(
        &n,
        &f,
        Instant::now() + Duration::from_secs(30),
        0,
        Kind::Plain,
    );
    let busy = t.begin(&n, &f);
    assert!(matches!(
        t.release_watched(&e, true),
        Handback::Lost { sweep: None }
    ));
    drop(busy);
    let e = t.add_watched(
        &n,
        &f,
        Instant::now() + Duration::from_secs(30),
        0,
        Kind::Plain,
    );
    match t.release_watched(&e, true) {
        Handback::Lost { sweep: Some(g) } => drop(g),
        _ => panic!("an unused field is swept"),
    }
    assert_eq!(t.len(), 0);
}

#[tokio::test]
async fn an_emptied_entry_reused_for_another_name_carries_nothing_over() {
    let t = core();
    let (a, b, f): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "f".into());
    t.add_fixed(&a, &f, Kind::Write, Instant::now() + Duration::from_secs(1));
    // A run of hand-overs that stopped counting leaves the entry empty, not new.
    // Its run began at the policy clock's origin, at least 10 ms ago.
    let _ = crate::state::queue::since_origin(Instant::now());
    std::thread::sleep(Duration::from_millis(10));
    t.with_queue(&a, |q| {
        for _ in 0..3 {
            q.run
                .offered(Duration::ZERO, crate::state::queue::Terms::Outright);
        }
        q.holder_until = Some(Instant::now() + Duration::from_secs(9));
    });
    assert!(matches!(
        t.release_fixed(&a, &f, Instant::now() + Duration::from_secs(1)),
        Handback::Send { holds: 1, .. }
    ));
    t.join_line(&a);
    assert!(t.leave_line(&a));
    assert_eq!(t.len(), 0);
    assert_eq!(t.spare(), 1, "the emptied entry was not kept");
    // The next name takes the spare entry: no holder or line count of `a`.
    assert_eq!(t.contents(&b), (0, 0));
    assert_eq!(t.spare(), 1, "the spare entry went back after use");
    t.with_queue(&b, |q| {
        assert!(q.sleeping.is_empty());
        assert_eq!(q.run, crate::state::queue::Run::default());
        assert!(q.holder_until.is_none());
    });
    assert_eq!(t.len(), 0);
    // A name that took many fields gives its memory back rather than keeping it.
    let c: Arc<str> = "c".into();
    let fields: Vec<Arc<str>> = (0..100).map(|i| format!("f{i}").into()).collect();
    for f in &fields {
        t.add_fixed(&c, f, Kind::Read, Instant::now() + Duration::from_secs(1));
    }
    for f in &fields {
        t.release_fixed(&c, f, Instant::now() + Duration::from_secs(1));
    }
    assert_eq!(t.len(), 0);
    assert_eq!(t.spare(), 0, "a large entry was kept");
}
