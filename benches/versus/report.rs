//! The report: medians and ranges over the rounds, the tables, the targets,
//! and the benchmark document's section between its markers.

use crate::cases::*;
use crate::load::Sample;
use crate::options::Options;
use crate::paced::Paced;
use crate::process::{command_line, cpu_model};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// One figure's median and range over the rounds.
pub fn median<T>(samples: &[T], figure: impl Fn(&T) -> f64) -> f64 {
    let mut values: Vec<f64> = samples.iter().map(figure).collect();
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

pub fn range<T>(samples: &[T], figure: impl Fn(&T) -> f64) -> (f64, f64) {
    samples
        .iter()
        .map(figure)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

pub fn report(
    options: &Options,
    bench: &Bench,
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    rate: f64,
    paced: &HashMap<&str, Vec<Paced>>,
) -> String {
    let mut out = header(options);
    for scenario in SCENARIOS {
        throughput_table(&mut out, bench, samples, scenario);
    }
    variants_table(&mut out, samples);
    cluster_table(&mut out, samples);
    if options.before.is_some() {
        before_and_after(&mut out, samples);
    }
    latency_table(&mut out, bench, rate, paced);
    out.push_str(&targets(options, samples, paced));
    out
}

/// The command, the machine and the versions, and how to read the tables.
fn header(options: &Options) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`cargo bench --bench versus -- --rounds {} --seconds {} --connections {}{}{}` on {}: {} ({} cores), {}; {}, {}, wrk 4 (one thread).\n",
        options.rounds,
        options.seconds,
        options.connections,
        if options.pin { " --pin" } else { "" },
        if options.scenarios.len() < SCENARIOS.len() {
            format!(" --scenarios {}", options.scenarios.join(","))
        } else {
            String::new()
        },
        command_line("date", &["-u", "+%Y-%m-%d"]),
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        command_line("uname", &["-sr"]),
        command_line("nginx", &["-v"]).replace("nginx version: ", ""),
        command_line("redis-server", &["--version"])
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    );
    let _ = writeln!(
        out,
        "Every server has one worker (thread or process); {}. \
         Medians of {} interleaved rounds, min–max in brackets. Admitted: the share of requests the upstream saw \
         (requests still in flight when wrk stops can put it a little over 100 %). \
         CPU: the serving process's and Redis's CPU time per request.\n",
        if options.pin {
            "**pinned**: the server under test alone on core 0; wrk, the upstream and Redis on core 1"
        } else {
            "wrk, the upstream and Redis share the same cores"
        },
        options.rounds
    );
    out
}

/// One scenario's closed-loop figures, every case, with each case's ratio
/// to nginx `limit_req`, to the bare Pingora proxy (the floor) and to
/// nginx + Lua + Redis (Kong's and APISIX's architecture). In allowed
/// traffic a case that answered anything but 2xx in any round is marked
/// failed instead of being averaged.
fn throughput_table(
    out: &mut String,
    bench: &Bench,
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    scenario: &str,
) {
    let rps_of = |case: &str| samples.get(&(scenario, case)).map(|s| median(s, |x| x.rps));
    let Some(nginx) = rps_of(NGINX_LIMIT_REQ) else {
        return;
    };
    // Floors exist only in allowed traffic (they do not limit).
    let bare = samples
        .get(&("allowed", BARE))
        .map(|s| median(s, |x| x.rps));
    let lua = rps_of(NGINX_LUA);
    let ratio = |value: f64, to: Option<f64>| {
        to.map_or("—".to_string(), |to| format!("{:.2}×", value / to))
    };
    let _ = writeln!(out, "{}\n", scenario_title(scenario));
    let _ = writeln!(
        out,
        "| case | req/s | vs nginx limit_req | vs bare Pingora | vs nginx + Lua + Redis | p50 ms | p99 ms | admitted | Redis calls/req | CPU µs/req (server + Redis) | context switches/req | syscalls/req | non-2xx | socket errors |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for case in &bench.cases {
        let Some(s) = samples.get(&(scenario, case.name)) else {
            continue;
        };
        let rps = median(s, |x| x.rps);
        let (lo, hi) = range(s, |x| x.rps);
        let non_2xx: u64 = s.iter().map(|x| x.non_2xx).sum();
        let failed = scenario == "allowed" && non_2xx > 0;
        let _ = writeln!(
            out,
            "| {}{} | {:.0} ({:.0}–{:.0}) | {:.2}× | {} | {} | {:.2} | {:.2} | {:.1} % | {} | {:.1} + {:.1} | {:.3} | {:.2} | {} | {} |",
            case.name,
            if failed { " **(failed: non-2xx)**" } else { "" },
            rps,
            lo,
            hi,
            rps / nginx,
            ratio(rps, bare),
            ratio(rps, lua),
            median(s, |x| x.p50_ms),
            median(s, |x| x.p99_ms),
            median(s, |x| x.admitted) * 100.0,
            if case.redis {
                format!("{:.4}", median(s, |x| x.redis_calls_per_request))
            } else {
                "—".into()
            },
            median(s, |x| x.server_cpu_us),
            median(s, |x| x.redis_cpu_us),
            median(s, |x| x.switches_per_request),
            median(s, |x| x.syscalls_per_request),
            if scenario == "allowed" { non_2xx.to_string() } else { "—".into() },
            s.iter().map(|x| x.errors).sum::<u64>(),
        );
    }
    out.push('\n');
}

/// The runtime flavour and the thread count, each as a ratio of the same
/// program's req/s (allowed traffic): one worker's runtime of its own against
/// a shared work-stealing one, and two worker threads against one.
fn variants_table(out: &mut String, samples: &HashMap<(&str, &str), Vec<Sample>>) {
    let rps = |case: &str| figure(samples, "allowed", case, |x| x.rps);
    let cpu = |case: &str| figure(samples, "allowed", case, |x| x.server_cpu_us);
    let _ = writeln!(
        out,
        "**Runtime and threads** (allowed traffic; each row against the same program with one worker thread and its own runtime)\n"
    );
    let _ = writeln!(out, "| variant | req/s | ratio | CPU µs/req |");
    let _ = writeln!(out, "|---|---|---|---|");
    for (variant, base) in [
        (BARE_STEALING, BARE),
        (SLUICE_STEALING, SLUICE_NOLIMIT),
        (BARE_2T, BARE),
        (SLUICE_NOLIMIT_2T, SLUICE_NOLIMIT),
        (SLUICE_LOG_2T, SLUICE_LOG),
    ] {
        let _ = writeln!(
            out,
            "| {variant} | {:.0} | {:.3}× {base} | {:.1} |",
            rps(variant),
            rps(variant) / rps(base),
            cpu(variant),
        );
    }
    out.push('\n');
}

/// A 3-primary Redis Cluster against one Redis, same limit, same rounds:
/// throughput, decide calls per request (per-node batches) and Redis CPU
/// (all three nodes') per request.
fn cluster_table(out: &mut String, samples: &HashMap<(&str, &str), Vec<Sample>>) {
    let _ = writeln!(
        out,
        "**Redis Cluster** (3 primaries on this machine, against one Redis; Redis CPU is the three nodes' together)\n"
    );
    let _ = writeln!(
        out,
        "| scenario | cluster req/s | ratio to one Redis | calls/req cluster · one Redis | Redis CPU µs/req cluster · one Redis |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for scenario in SCENARIOS {
        let (Some(c), Some(one)) = (
            samples.get(&(scenario, SLUICE_CLUSTER)),
            samples.get(&(scenario, SLUICE_LOG)),
        ) else {
            continue;
        };
        let _ = writeln!(
            out,
            "| {scenario} | {:.0} | {:.3}× | {:.4} · {:.4} | {:.1} · {:.1} |",
            median(c, |x| x.rps),
            median(c, |x| x.rps) / median(one, |x| x.rps),
            median(c, |x| x.redis_calls_per_request),
            median(one, |x| x.redis_calls_per_request),
            median(c, |x| x.redis_cpu_us),
            median(one, |x| x.redis_cpu_us),
        );
    }
    out.push('\n');
}

/// The earlier build against this one, measured in the same rounds: the
/// ratio of medians, and each side's spread (min–max over the rounds) so
/// that a difference can be told from noise.
fn before_and_after(out: &mut String, samples: &HashMap<(&str, &str), Vec<Sample>>) {
    let _ = writeln!(
        out,
        "**Before and after** (the `--before` build and this one, interleaved in the same rounds)\n"
    );
    let _ = writeln!(
        out,
        "| scenario, case | before req/s (min–max) | after req/s (min–max) | after / before | CPU µs/req before → after |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    let pairs = [
        ("allowed", BEFORE_NOLIMIT, SLUICE_NOLIMIT),
        ("allowed", BEFORE_LOG, SLUICE_LOG),
        ("flood", BEFORE_LOG, SLUICE_LOG),
        ("mix", BEFORE_LOG, SLUICE_LOG),
    ];
    for (scenario, before, after) in pairs {
        let (Some(b), Some(a)) = (
            samples.get(&(scenario, before)),
            samples.get(&(scenario, after)),
        ) else {
            continue;
        };
        let (b_lo, b_hi) = range(b, |x| x.rps);
        let (a_lo, a_hi) = range(a, |x| x.rps);
        let _ = writeln!(
            out,
            "| {scenario}, {after} | {:.0} ({b_lo:.0}–{b_hi:.0}) | {:.0} ({a_lo:.0}–{a_hi:.0}) | {:.3}× | {:.1} → {:.1} |",
            median(b, |x| x.rps),
            median(a, |x| x.rps),
            median(a, |x| x.rps) / median(b, |x| x.rps),
            median(b, |x| x.server_cpu_us),
            median(a, |x| x.server_cpu_us),
        );
    }
    out.push('\n');
}

/// The open-loop figures at one rate below saturation.
fn latency_table(out: &mut String, bench: &Bench, rate: f64, paced: &HashMap<&str, Vec<Paced>>) {
    let _ = writeln!(
        out,
        "**Latency below saturation**: every case driven at {rate:.0} req/s (half the peak of sluice + Redis sliding_log), allowed traffic, open loop (a late response delays the next send, and that delay counts). \
         The upstream alone, driven the same way, shows this machine's own latency noise.\n"
    );
    let _ = writeln!(
        out,
        "| case | sent req/s | p50 ms | p99 ms | p99 over sluice, no limit |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    let base_p99 = paced
        .get(SLUICE_NOLIMIT)
        .map_or(0.0, |p| median(p, |x| x.p99_ms));
    for case in bench.paced_cases() {
        let Some(p) = paced.get(case.name) else {
            continue;
        };
        let p99 = median(p, |x| x.p99_ms);
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2} | {:.2} | {:+.2} ms |",
            case.name,
            median(p, |x| x.achieved),
            median(p, |x| x.p50_ms),
            p99,
            p99 - base_p99
        );
    }
    out.push('\n');
}

fn scenario_title(scenario: &str) -> &'static str {
    match scenario {
        "allowed" => "**Allowed traffic** (100,000 keys at random; nothing is denied)",
        "flood" => "**Flood on one key** (all but 1,000 a minute denied)",
        _ => "**Mix** (90 % allowed over 100,000 keys, 10 % on one flooded key)",
    }
}

/// One target: what it says, the measured value, the bound, and whether
/// the value must be at least (true) or at most (false) the bound.
type Target = (String, f64, f64, bool);

/// The targets, each with its measured figure.
fn targets(
    options: &Options,
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    paced: &HashMap<&str, Vec<Paced>>,
) -> String {
    let mut rows: Vec<Target> = floor_targets(samples)
        .into_iter()
        .chain(earlier_targets(samples, paced))
        .chain(cost_targets(samples, paced))
        .collect();
    let cpu_in = |scenario: &str, case: &str| figure(samples, scenario, case, |x| x.server_cpu_us);
    for scenario in ["allowed", "flood"] {
        rows.push((
            format!("tracing 1 % sampled (denials always, ≤ 100/s) ≤ 1.03× sluice + Redis sliding_log, CPU per request ({scenario})"),
            cpu_in(scenario, SLUICE_TRACED) / cpu_in(scenario, SLUICE_LOG),
            1.03,
            false,
        ));
    }
    if options.pin {
        let cpu = |case: &str| figure(samples, "allowed", case, |x| x.server_cpu_us);
        rows.push((
            "pinned: sluice + Redis sliding_log ≤ 1.15× sluice without limits, CPU per request on its own core (allowed)".into(),
            cpu(SLUICE_LOG) / cpu(SLUICE_NOLIMIT),
            1.15,
            false,
        ));
    }
    let mut out = String::from("| target | measured | met |\n|---|---|---|\n");
    for (what, value, bound, at_least) in rows {
        let met = if at_least {
            value >= bound
        } else {
            value <= bound
        };
        let _ = writeln!(
            out,
            "| {what} | {value:.3} | {} |",
            if met { "yes" } else { "**no**" }
        );
    }
    out
}

/// The median of `figure` for (scenario, case); NaN when it did not run.
fn figure(
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    scenario: &str,
    case: &str,
    figure: impl Fn(&Sample) -> f64,
) -> f64 {
    samples
        .get(&(scenario, case))
        .map_or(f64::NAN, |s| median(s, figure))
}

/// Against the Pingora floor and nginx + Lua + Redis.
fn floor_targets(samples: &HashMap<(&str, &str), Vec<Sample>>) -> Vec<Target> {
    let rps = |scenario: &str, case: &str| figure(samples, scenario, case, |x| x.rps);
    let redis_cpu = |case: &str| figure(samples, "allowed", case, |x| x.redis_cpu_us);
    let cpu = |case: &str| figure(samples, "allowed", case, |x| x.server_cpu_us);
    let non_2xx: u64 = samples
        .iter()
        .filter(|((scenario, _), _)| *scenario == "allowed")
        .flat_map(|(_, s)| s.iter().map(|x| x.non_2xx))
        .sum();
    vec![
        (
            "sluice without limits ≥ 0.97× the bare Pingora proxy (allowed)".into(),
            rps("allowed", SLUICE_NOLIMIT) / rps("allowed", BARE),
            0.97,
            true,
        ),
        (
            "sluice with a rewrite, 2 header edits and a request ID ≤ 1.05× sluice without limits, CPU per request (allowed)".into(),
            cpu(SLUICE_FORWARDING) / cpu(SLUICE_NOLIMIT),
            1.05,
            false,
        ),
        (
            "sluice + Redis sliding_log ≥ 1.0× nginx + Lua + Redis (allowed)".into(),
            rps("allowed", SLUICE_LOG) / rps("allowed", NGINX_LUA),
            1.0,
            true,
        ),
        (
            "sluice + Redis sliding_log ≥ 0.85× sluice without limits (allowed)".into(),
            rps("allowed", SLUICE_LOG) / rps("allowed", SLUICE_NOLIMIT),
            0.85,
            true,
        ),
        (
            "Redis CPU per decision, sliding_log ≤ 0.5× nginx + Lua + Redis's".into(),
            redis_cpu(SLUICE_LOG) / redis_cpu(NGINX_LUA),
            0.5,
            false,
        ),
        (
            "Redis CPU per decision, sliding_window ≤ 0.5× nginx + Lua + Redis's".into(),
            redis_cpu(SLUICE_WINDOW) / redis_cpu(NGINX_LUA),
            0.5,
            false,
        ),
        (
            "flood: sluice + Redis sliding_log ≥ 2.0× nginx + Lua + Redis".into(),
            rps("flood", SLUICE_LOG) / rps("flood", NGINX_LUA),
            2.0,
            true,
        ),
        (
            "flood: ≤ 0.01 Redis calls per request".into(),
            figure(samples, "flood", SLUICE_LOG, |x| x.redis_calls_per_request),
            0.01,
            false,
        ),
        (
            "allowed traffic: non-2xx responses, every case and round".into(),
            non_2xx as f64,
            0.0,
            false,
        ),
    ]
}

/// The earlier targets against nginx `limit_req`, kept for the record.
fn earlier_targets(
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    paced: &HashMap<&str, Vec<Paced>>,
) -> Vec<Target> {
    let rps = |scenario: &str, case: &str| figure(samples, scenario, case, |x| x.rps);
    let p99 = |case: &str| paced_p99(paced, case);
    let mut rows: Vec<Target> = vec![
        (
            "sluice + Redis sliding_log ≥ 1.0× nginx limit_req (allowed)".into(),
            rps("allowed", SLUICE_LOG) / rps("allowed", NGINX_LIMIT_REQ),
            1.0,
            true,
        ),
        (
            "flood: ≥ 2× the allowed-traffic req/s".into(),
            rps("flood", SLUICE_LOG) / rps("allowed", SLUICE_LOG),
            2.0,
            true,
        ),
    ];
    for case in [SLUICE_LOG, SLUICE_WINDOW, SLUICE_LOCAL] {
        rows.push((
            format!("p99 at half load: {case} adds ≤ 0.5 ms over no limit (ms added)"),
            p99(case) - p99(SLUICE_NOLIMIT),
            0.5,
            false,
        ));
    }
    rows
}

/// The median p99 of `case` at the paced rate; NaN when it did not run.
fn paced_p99(paced: &HashMap<&str, Vec<Paced>>, case: &str) -> f64 {
    paced
        .get(case)
        .map_or(f64::NAN, |p| median(p, |x| x.p99_ms))
}

/// What limiting may cost the gateway over not limiting, against what
/// nginx + Lua + Redis pays over nginx `limit_req`.
fn cost_targets(
    samples: &HashMap<(&str, &str), Vec<Sample>>,
    paced: &HashMap<&str, Vec<Paced>>,
) -> Vec<Target> {
    let allowed = |case: &str, f: fn(&Sample) -> f64| figure(samples, "allowed", case, f);
    let rps = |scenario: &str, case: &str| figure(samples, scenario, case, |x| x.rps);
    let p99 = |case: &str| paced_p99(paced, case);
    vec![
        (
            "system calls per request: sluice + Redis sliding_log ≤ 1.5× sluice without limits (allowed)".into(),
            allowed(SLUICE_LOG, |x| x.syscalls_per_request)
                / allowed(SLUICE_NOLIMIT, |x| x.syscalls_per_request),
            1.5,
            false,
        ),
        (
            "context switches per request: sluice + Redis sliding_log ≤ 0.05 (allowed)".into(),
            allowed(SLUICE_LOG, |x| x.switches_per_request),
            0.05,
            false,
        ),
        (
            "sluice + Redis sliding_log ≥ 0.90× nginx + Lua + Redis (allowed)".into(),
            rps("allowed", SLUICE_LOG) / rps("allowed", NGINX_LUA),
            0.90,
            true,
        ),
        (
            "flood: sluice + Redis sliding_log ≥ 1.5× nginx + Lua + Redis".into(),
            rps("flood", SLUICE_LOG) / rps("flood", NGINX_LUA),
            1.5,
            true,
        ),
        (
            "sluice + Redis sliding_log ≤ 1.15× sluice without limits, CPU per request (allowed)".into(),
            allowed(SLUICE_LOG, |x| x.server_cpu_us) / allowed(SLUICE_NOLIMIT, |x| x.server_cpu_us),
            1.15,
            false,
        ),
        (
            "p99 at half load, ms added by the limiter: sluice + Redis over sluice without limits, less nginx + Lua + Redis's over nginx limit_req (≤ 0)".into(),
            (p99(SLUICE_LOG) - p99(SLUICE_NOLIMIT)) - (p99(NGINX_LUA) - p99(NGINX_LIMIT_REQ)),
            0.0,
            false,
        ),
    ]
}

/// Replaces the text between the benchmark document's markers with `report`.
/// Replaces what lies between `<!-- {part}:begin -->` and
/// `<!-- {part}:end -->` in `document` with `section`.
pub fn embed(document: &Path, part: &str, section: &str) {
    let (begin, end) = (
        format!("<!-- {part}:begin -->"),
        format!("<!-- {part}:end -->"),
    );
    let Ok(text) = std::fs::read_to_string(document) else {
        return;
    };
    match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => {
            let updated = format!("{}{begin}\n{section}{}", &text[..b], &text[e..]);
            std::fs::write(document, updated).expect("update the benchmark document");
            eprintln!("{} updated ({part})", document.display());
        }
        _ => eprintln!(
            "{} has no {begin} … {end} block; not updated",
            document.display()
        ),
    }
}
