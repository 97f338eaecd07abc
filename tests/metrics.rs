//! With the `metrics` feature, a client's events reach the installed `metrics` recorder
//! (its own test binary: the recorder is process-wide).
#![cfg(feature = "metrics")]

mod common;

use common::RedisServer;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString};
use parking_lot::Mutex;
use redis_rlock::Client;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
struct Seen(Mutex<HashMap<String, u64>>);

struct Named(String, Arc<Seen>);

impl metrics::CounterFn for Named {
    fn increment(&self, n: u64) {
        *self.1 .0.lock().entry(self.0.clone()).or_default() += n;
    }
    fn absolute(&self, _: u64) {}
}

impl metrics::HistogramFn for Named {
    fn record(&self, _: f64) {
        *self.1 .0.lock().entry(self.0.clone()).or_default() += 1;
    }
}

struct Rec(Arc<Seen>);

impl Recorder for Rec {
    fn describe_counter(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Named(key.name().to_string(), self.0.clone())))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Named(key.name().to_string(), self.0.clone())))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_installed_recorder() {
    let seen = Arc::new(Seen::default());
    metrics::set_global_recorder(Rec(seen.clone())).unwrap();
    let s = RedisServer::start();
    let c = Client::connect(s.url()).await.unwrap();
    for _ in 0..3 {
        c.lock("st:m").lock().await.unwrap().unlock().await.unwrap();
    }
    let seen = seen.0.lock().clone();
    assert_eq!(seen.get("rlock_acquisitions_total"), Some(&3), "{seen:?}");
    assert_eq!(seen.get("rlock_releases_total"), Some(&3), "{seen:?}");
    assert_eq!(seen.get("rlock_acquire_wait_seconds"), Some(&3), "{seen:?}");
    assert_eq!(seen.get("rlock_hold_seconds"), Some(&3), "{seen:?}");
}
