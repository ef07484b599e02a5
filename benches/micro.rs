//! Micro-benchmarks of the request path's CPU-only steps (targets: route matching under 1 µs, key building under 300 ns):
//! route matching over 1,000 routes (< 1 µs), key building (< 300 ns), and
//! the in-process limiter under contention from two threads.
//!
//!   cargo bench --bench micro

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice::config::{Algorithm, KeyPart, PathMatch, RouteAction, RouteConfig};
use sluice::keys::{build_key, PartValue, RequestParts};
use sluice::limiter::local::LocalLimiter;
use sluice::limiter::LimitCheck;
use sluice::route::RouteTable;
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
                black_box(&long_user),
                true,
            )
        })
    });
    group.finish();
}

fn check(key: &str) -> LimitCheck<'_> {
    LimitCheck {
        key,
        limit: 1_000_000_000,
        window: Duration::from_secs(60),
        cost: 1,
        algorithm: Algorithm::SlidingWindow { buckets: 10 },
        shadow: false,
        block: Duration::ZERO,
        deferred: false,
        max_delay: Duration::ZERO,
    }
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

criterion_group!(benches, route_matching, key_building, local_limiter);
criterion_main!(benches);
