//! The policy step on real state built from YAML, with the in-process limiter
//! (or a Redis URL nobody listens on, for the failure policy).

use super::*;
use crate::config::Config;
use crate::observe::metrics::{DecisionLabel, Metrics};
use crate::policy::rejection::ErrorBody;
use std::net::Ipv4Addr;
use std::path::Path;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn state(body: &str) -> (GatewayState, Metrics) {
    let text = format!("upstreams:\n  api: {{ servers: [\"127.0.0.1:9\"] }}\n{body}");
    let config = Config::from_text(Path::new("policy.yaml"), &text, |name| {
        (name == "JWT_SECRET").then(|| SECRET.to_string())
    })
    .expect("test config");
    let metrics = Metrics::new().expect("metrics");
    let state = GatewayState::build(config, &metrics, None).expect("state");
    (state, metrics)
}

fn head(path: &str, headers: &[(&str, &str)]) -> RequestHeader {
    let mut req = RequestHeader::build("GET", path.as_bytes(), None).expect("head");
    req.insert_header("host", "api").expect("host");
    for (name, value) in headers {
        req.append_header(name.to_string(), *value).expect("header");
    }
    req
}

/// A state with the in-process limiter and one route `r` over everything,
/// with `limit` (one flow-mapping line) as its only limit, after `extra`.
fn one_limit(extra: &str, limit: &str) -> (GatewayState, Metrics) {
    state(&format!(
        "{extra}limiter: {{ backend: local }}\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: api\n    limits:\n      - {limit}\n"
    ))
}

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));

fn judge_now<'a>(
    state: &GatewayState,
    route: &'a CompiledRoute,
    head: &RequestHeader,
) -> Judgement<'a> {
    let view = RequestView {
        head,
        peer: PEER,
        path: head.uri.path(),
        client_cert: None,
        body: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(judge(state, route, &view))
}

fn rejection_status(judgement: &Judgement<'_>) -> Option<u16> {
    match &judgement.step {
        Step::Reject(rejection) => Some(rejection.reply().status),
        Step::Proceed(_) => None,
    }
}

const TWO_LIMITS: &str = r#"
limiter: { backend: local }
routes:
  - name: sms
    match: { path_prefix: / }
    upstream: api
    limits:
      - { name: burst, key: [ip], limit: 2, window: 10s }
      - { name: daily, key: [ip], limit: 3, window: 1h }
      - { name: watch, key: [ip], limit: 1, window: 1h, shadow: true }
"#;

#[test]
fn the_longest_denial_names_the_rejection_and_headers_come_most_restrictive_first() {
    let (state, metrics) = state(TWO_LIMITS);
    let route = &state.compiled[0];
    let req = head("/send", &[]);

    let first = judge_now(&state, route, &req);
    assert!(matches!(first.step, Step::Proceed(None)));
    assert_eq!(first.report.client, Some(PEER));
    // Shadow limits never show in the headers.
    let order: Vec<&str> = first
        .report
        .rate
        .iter()
        .map(|e| route.limits[e.limit].config.name.as_str())
        .collect();
    assert_eq!(order, ["burst", "daily"]);

    let second = judge_now(&state, route, &req);
    let verdict = second.report.verdict.expect("verdict");
    assert_eq!(
        verdict.label,
        DecisionLabel::ShadowDeny,
        "the shadow limit would deny"
    );
    assert_eq!(verdict.limit, Some(2));
    assert!(matches!(second.step, Step::Proceed(None)));

    let third = judge_now(&state, route, &req);
    let Step::Reject(Rejection::TooMany {
        status,
        route: name,
        limit,
        retry_after,
        ref headers,
        ..
    }) = third.step
    else {
        panic!("third request admitted: {:?}", third.step);
    };
    assert_eq!((status, name, limit), (429, "sms", "burst"));
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    assert!(headers.iter().any(|(n, _)| *n == "x-ratelimit-limit"));

    let reply = third.step_reply();
    assert_eq!(reply.status, 429);
    assert_eq!(reply.headers[0].0, "retry-after");
    let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
    assert_eq!(body["error"], "too_many_requests");
    assert_eq!(body["route"], "sms");
    assert_eq!(body["limit"], "burst");
    assert_eq!(body["retry_after_seconds"], retry_after);

    // Counted: two admissions on each limit, one denial on `burst` only
    // (`daily` admitted it but consumed nothing), shadow denials on `watch`.
    let text = String::from_utf8(metrics.encode()).expect("utf-8");
    let count = |limit: &str, decision: &str| -> u64 {
        let needle = format!("limit=\"{limit}\",route=\"sms\",source=\"local\"");
        text.lines()
            .filter(|l| {
                l.starts_with("sluice_ratelimit_decisions_total")
                    && l.contains(&needle)
                    && l.contains(&format!("decision=\"{decision}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(count("burst", "allow"), 2);
    assert_eq!(count("burst", "deny"), 1);
    assert_eq!(count("daily", "deny"), 0);
    assert_eq!(count("watch", "shadow_deny"), 2);
}

impl Judgement<'_> {
    fn step_reply(&self) -> Reply {
        match &self.step {
            Step::Reject(rejection) => rejection.reply(),
            Step::Proceed(_) => panic!("not a rejection"),
        }
    }
}

#[test]
fn a_required_identity_guards_routes_without_limits_too() {
    let (state, _) = state(
        r#"
identity:
  jwt: { algorithms: [HS256], secret_env: JWT_SECRET, required: true }
limiter: { backend: local }
routes:
  - { name: open, match: { path_prefix: / }, upstream: api }
"#,
    );
    let route = &state.compiled[0];
    for headers in [&[][..], &[("authorization", "Bearer not-a-token")][..]] {
        let judgement = judge_now(&state, route, &head("/", headers));
        assert_eq!(rejection_status(&judgement), Some(401), "{headers:?}");
        let reply = judgement.step_reply();
        assert_eq!(reply.headers[0].0, "www-authenticate");
        assert_eq!(&reply.body[..], br#"{"error":"unauthorized"}"#);
    }
}

#[test]
fn an_untrusted_identity_header_is_no_user_and_limits_fall_back_to_on_missing() {
    let (state, _) = one_limit(
        "identity: { header: x-user }\n",
        "{ name: per-user, key: [user], limit: 1, window: 1h, on_missing: skip }",
    );
    let route = &state.compiled[0];
    // The peer is not a trusted proxy: its x-user is not believed, the limit
    // is skipped, nothing is counted and nothing is denied.
    for _ in 0..3 {
        let judgement = judge_now(&state, route, &head("/", &[("x-user", "alice")]));
        assert!(matches!(judgement.step, Step::Proceed(None)));
        assert!(judgement.report.verdict.is_none());
    }
}

#[test]
fn a_failed_limiter_with_on_error_deny_is_unavailable() {
    let (state, _) = state(
        r#"
limiter:
  backend: redis
  redis: { url: "redis://127.0.0.1:1/0", timeout: 200ms }
  on_error: deny
routes:
  - name: pay
    match: { path_prefix: / }
    upstream: api
    limits:
      - { name: l, key: [ip], limit: 5, window: 1s }
"#,
    );
    let judgement = judge_now(&state, &state.compiled[0], &head("/", &[]));
    let verdict = judgement.report.verdict.expect("verdict");
    assert_eq!(verdict.source, Source::FailClosed);
    let reply = judgement.step_reply();
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.headers,
        vec![("retry-after", HeaderValue::from_static("1"))]
    );
    assert_eq!(
        &reply.body[..],
        br#"{"error":"rate_limiter_unavailable","route":"pay"}"#
    );
}

#[test]
fn concurrency_leases_are_held_and_released() {
    let (state, _) = one_limit(
        "",
        "{ name: slots, key: [ip], limit: 1, algorithm: concurrency }",
    );
    let route = &state.compiled[0];
    let req = head("/", &[]);
    let Step::Proceed(Some(leases)) = judge_now(&state, route, &req).step else {
        panic!("no lease held");
    };
    assert_eq!(rejection_status(&judge_now(&state, route, &req)), Some(429));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(leases.release(&state, route, 200));
    assert!(matches!(
        judge_now(&state, route, &req).step,
        Step::Proceed(Some(_))
    ));
}

#[test]
fn routing_refuses_what_cannot_be_made_canonical_and_what_matches_nothing() {
    let (state, _) = state(
        r#"
limiter: { backend: local }
routes:
  - { name: v1, match: { path_prefix: /v1/ }, upstream: api }
"#,
    );
    let slashes = EscapedSlashes::Reject;
    let routed = route(&state, &head("/v1//a/./b", &[]), slashes).expect("routed");
    assert_eq!(routed.route, 0);
    assert_eq!(routed.rewritten_path.as_deref(), Some("/v1/a/b"));
    assert_eq!(
        route(&state, &head("/v2/", &[]), slashes).err(),
        Some(Rejection::NotFound)
    );
    for bad in ["/v1/%2e%2e/%2e%2e/x", "/v1/a%00", "/v1/a%2Fb", "/v1/..%5c"] {
        assert_eq!(
            route(&state, &head(bad, &[]), slashes).err(),
            Some(Rejection::BadRequest),
            "{bad}"
        );
    }
}

#[test]
fn rejections_render_the_documented_bodies() {
    assert_eq!(
        &Rejection::BadRequest.reply().body[..],
        br#"{"error":"bad_request"}"#
    );
    assert_eq!(
        &Rejection::NotFound.reply().body[..],
        br#"{"error":"not_found"}"#
    );
    let too_many = Rejection::TooMany {
        status: 429,
        route: "r\"x",
        limit: "l",
        counts_tokens: false,
        retry_after: 3,
        headers: Vec::new(),
    };
    let reply = too_many.reply();
    assert_eq!(reply.content_type, "application/json");
    assert_eq!(
        &reply.body[..],
        br#"{"error":"too_many_requests","route":"r\"x","limit":"l","retry_after_seconds":3}"#
    );
    let fixed = fixed_reply(204, "ok", Vec::new());
    assert_eq!(
        (fixed.status, fixed.content_type),
        (204, "text/plain; charset=utf-8")
    );
}

/// The hand-written rejection body is what serde_json writes for the same
/// fields, for names, absent fields, and strings that need escaping.
#[test]
fn rejection_bodies_are_the_json_serde_would_write() {
    let bodies = [
        ErrorBody::only("not_found"),
        ErrorBody {
            route: Some("sms-send_2"),
            limit: Some("per-ip"),
            retry_after_seconds: Some(17),
            ..ErrorBody::only("too_many_requests")
        },
        ErrorBody {
            route: Some("a\"b\\c</script>\u{7}é"),
            limit: Some(""),
            retry_after_seconds: Some(u64::MAX),
            ..ErrorBody::only("too_many_requests")
        },
        ErrorBody {
            route: Some("llm"),
            limit: Some("tokens"),
            reason: Some("the request body is not JSON"),
            ..ErrorBody::only("bad_body")
        },
        ErrorBody {
            route: None,
            limit: Some("x"),
            ..ErrorBody::only("bad_gateway")
        },
    ];
    for body in bodies {
        let expected = serde_json::to_vec(&body).expect("serde_json");
        assert_eq!(
            String::from_utf8(body.to_json()).unwrap(),
            String::from_utf8(expected).unwrap()
        );
    }
}
