//! Micro-benchmarks of the request path's CPU-only steps (targets: route matching under 1 µs, key building under 300 ns):
//! route matching over 1,000 routes (< 1 µs), key building (< 300 ns), and
//! the in-process limiter under contention from two threads.
//!
//! An API-key lookup among 10,000 consumers (< 1 µs) beside no identity.
//!
//!   cargo bench --bench micro

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark stops on what it did not expect
#![allow(missing_docs)] // criterion_group! defines an undocumented public function

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice::config::{Algorithm, KeyPart, PathMatch, RouteAction, RouteConfig};
use sluice::limiter::local::LocalLimiter;
use sluice::limiter::LimitCheck;
use sluice::policy::keys::build_key;
use sluice::policy::route::RouteTable;
use sluice::request::parts::{PartValue, RequestParts};
use std::sync::Arc;
use std::time::Duration;

fn routes(n: usize) -> Vec<RouteConfig> {
    (0..n)
        .map(|i| RouteConfig {
            name: format!("route-{i}"),
            path: PathMatch::Prefix(format!("/api/v1/service-{i}/")),
            methods: vec!["GET".into(), "POST".into()],
            host: (i % 2 == 0).then(|| "api.example.com".to_string()),
            action: RouteAction::Respond {
                status: 200,
                body: String::new(),
            },
            limits: Vec::new(),
            exempt: Default::default(),
            max_body_bytes: 0,
            forward: Default::default(),
            rate_headers: sluice::config::HeaderStyle::Legacy,
            errors: Default::default(),
        })
        .collect()
}

fn route_matching(c: &mut Criterion) {
    let table = RouteTable::new(&routes(1000));
    let mut group = c.benchmark_group("route_matching_1000_routes");
    group.bench_function("first", |b| {
        b.iter(|| {
            table.find(
                black_box("GET"),
                Some("api.example.com:8080"),
                black_box("/api/v1/service-0/items/42"),
            )
        })
    });
    group.bench_function("last", |b| {
        b.iter(|| {
            table.find(
                black_box("POST"),
                Some("api.example.com"),
                black_box("/api/v1/service-999/items/42"),
            )
        })
    });
    group.bench_function("none", |b| {
        b.iter(|| {
            table.find(
                black_box("GET"),
                Some("api.example.com"),
                black_box("/nowhere"),
            )
        })
    });
    group.finish();
}

fn key_building(c: &mut Criterion) {
    let header = |name: &str| (name == "x-api-key").then_some(&b"key_0123456789abcdef"[..]);
    let parts = RequestParts {
        ip: "203.0.113.7",
        user: Some(b"user_1001"),
        method: "POST",
        path: b"/sms/send",
        header: &header,
        query: b"page=2&api_key=key_0123456789abcdef",
        cookie: &|_| PartValue::Missing,
        param: &|_| None,
        client_cert: None,
    };
    let ip = [KeyPart::Ip];
    let user_and_header = [KeyPart::User, KeyPart::Header("x-api-key".into())];
    let long_user = RequestParts {
        user: Some(b"a-very-long-user-identifier-that-exceeds-sixty-four-bytes-and-is-hashed"),
        ..parts
    };
    let mut group = c.benchmark_group("key_building");
    group.bench_function("ip", |b| {
        b.iter(|| {
            build_key(
                "sluice:",
                "sms-send",
                "per-ip",
                &ip,
                &[],
                black_box(&parts),
                true,
            )
        })
    });
    group.bench_function("user_and_header", |b| {
        b.iter(|| {
            build_key(
                "sluice:",
                "sms-send",
                "per-user",
                &user_and_header,
                &[],
                black_box(&parts),
                true,
            )
        })
    });
    group.bench_function("hashed_user", |b| {
        b.iter(|| {
            build_key(
                "sluice:",
                "sms-send",
                "per-user",
                &[KeyPart::User],
                &[],
                black_box(&long_user),
                true,
            )
        })
    });
    group.finish();
}

fn check(key: &str) -> LimitCheck<'_> {
    let algorithm = Algorithm::SlidingWindow { buckets: 10 };
    LimitCheck::plain(key, 1_000_000_000, Duration::from_secs(60), algorithm)
}

fn local_limiter(c: &mut Criterion) {
    // sliding_window keeps per-key memory constant while the benchmark admits
    // millions of requests.
    let limiter = Arc::new(LocalLimiter::new(1_000_000));
    let keys: Vec<String> = (0..1024).map(|i| format!("sluice:{{r:l:{i}}}")).collect();
    let mut group = c.benchmark_group("local_limiter");
    group.bench_function("one_thread", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 1) % keys.len();
            limiter.decide(&[check(&keys[i])], "m")
        })
    });
    group.bench_function("two_threads_contended", |b| {
        b.iter_custom(|iterations| {
            let start = std::time::Instant::now();
            std::thread::scope(|scope| {
                for t in 0..2 {
                    let limiter = Arc::clone(&limiter);
                    let keys = &keys;
                    scope.spawn(move || {
                        for n in 0..iterations as usize {
                            // Both threads walk the same keys: same shards, same locks.
                            let key = &keys[(n + t) % keys.len()];
                            black_box(limiter.decide(&[check(key)], "m"));
                        }
                    });
                }
            });
            // Time per decision, two decisions per iteration.
            start.elapsed() / 2
        })
    });
    group.finish();
}

/// The identity step with an API key among 10,000 consumers (a hit and a
/// miss) beside the same step with no identity configured: what a key
/// lookup adds to a request.
fn api_key_lookup(c: &mut Criterion) {
    use sluice::policy::identity::Identity;
    use sluice::request::HeaderValues;
    let dir = tempfile::tempdir().expect("tempdir");
    let consumers = dir.path().join("consumers.yaml");
    let mut text = String::from("consumers:\n");
    for i in 0..10_000 {
        let line =
            sluice::config::consumers::key_line(format!("key-{i:05}-0123456789abcdef").as_bytes());
        text.push_str(&format!(
            "  - {{ id: c{i}, plan: pro, keys: [\"{line}\"] }}\n"
        ));
    }
    std::fs::write(&consumers, text).expect("write consumers");
    let config = format!(
        "identity:\n  api_key:\n    file: \"{}\"\n",
        consumers.display()
    );
    let load = |text: &str| {
        sluice::config::Config::from_text(std::path::Path::new("bench.yaml"), text, |_| None)
            .expect("config")
    };
    let metrics = sluice::observe::metrics::Metrics::new().expect("metrics");
    let with_keys =
        Identity::new(&load(&config).identity, "", &metrics.identity).expect("identity");
    let without = Identity::new(&load("").identity, "", &metrics.identity).expect("identity");
    let hit = b"key-04711-0123456789abcdef".as_slice();
    let miss = b"key-99999-0123456789abcdef".as_slice();
    let sent = |key: &'static [u8]| move |_: &str| HeaderValues::One(key);
    let mut group = c.benchmark_group("api_key");
    group.bench_function("no_identity", |b| {
        b.iter(|| black_box(without.establish(sent(hit), false)))
    });
    group.bench_function("hit_of_10000", |b| {
        b.iter(|| black_box(with_keys.establish(sent(hit), false)))
    });
    group.bench_function("miss_of_10000", |b| {
        b.iter(|| black_box(with_keys.establish(sent(miss), false)))
    });
    // The Redis store's warm path: the key hashed, its answer found in the
    // lookup cache (10,000 answers cached).
    let store =
        sluice::policy::identity::key_store::RedisKeys::new("sluice:", Duration::from_secs(60));
    for i in 0..10_000 {
        let key = format!("key-{i:05}-0123456789abcdef");
        let consumer = sluice::config::consumers::Consumer {
            id: Arc::from(format!("c{i}").as_str()),
            plan: Some(Arc::from("pro")),
        };
        store.remember(
            sluice::config::consumers::key_hash(key.as_bytes()),
            Some(consumer),
        );
    }
    group.bench_function("redis_store_warm_cache_hit", |b| {
        b.iter(|| black_box(store.cached(&sluice::config::consumers::key_hash(black_box(hit)))))
    });
    group.finish();
}

/// What `/v1/top`'s sketch costs a denial: one key flooding (found in the
/// sketch), and 100,000 keys in turn (each one evicting the smallest).
fn denied_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("denied_keys_record");
    let sketch = sluice::observe::top_keys::DeniedKeys::default();
    let now = std::time::Instant::now();
    group.bench_function("flood_one_key", |b| {
        b.iter(|| sketch.record(black_box("10.0.0.1"), now))
    });
    let keys: Vec<String> = (0..100_000)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    let mut next = 0;
    group.bench_function("100000_keys_evicting", |b| {
        b.iter(|| {
            next = (next + 1) % keys.len();
            sketch.record(black_box(&keys[next]), now)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    route_matching,
    key_building,
    local_limiter,
    api_key_lookup,
    denied_keys
);
criterion_main!(benches);
