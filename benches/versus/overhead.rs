//! What sluice's own process costs a request, counted in instructions
//! (`--parts overhead`), each against its floor in one run:
//!
//! - allowed traffic: the bare Pingora proxy (the floor of any proxy built
//!   on Pingora), sluice without limits, sluice with one `sliding_log` limit
//!   in process (`backend: local`) and on Redis;
//! - a flood of one key, every measured request denied: a bare Pingora
//!   answering a fixed 429 from `request_filter` (the floor of a denial),
//!   sluice denying in process, and sluice + Redis denying from its deny
//!   cache (the key's remembered denial, no Redis call).
//!
//! Each runs alone under `valgrind --tool=callgrind` (one worker thread),
//! driven by wrk after a warm-up; the counters are zeroed before the
//! measured run and dumped after it, and divided by the requests wrk
//! completed. Every thread of the process is counted, the kernel is not.
//! Each dump is then split by where the instructions were spent: the
//! functions' own (exclusive) instructions, grouped by the crate that
//! defines them (read from the dump), so that the difference between a
//! case and its floor reads as "sluice's code", "more of Pingora's", "more
//! allocation" and so on.

use crate::common::free_port;
use crate::instructions::{
    callgrind_wrapper, control, denies, dump_file, sluice_binary, warm_up, Rig, Setup, CONNECTIONS,
};
use crate::load::run_wrk;
use crate::options::Options;
use crate::process::{command_line, cpu_model, wait_for_port, Daemon};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a function's instructions are counted, in the order of the table.
const GROUPS: [&str; 8] = [
    "sluice",
    "pingora",
    "tokio",
    "http, httparse, bytes",
    "prometheus",
    "std, core, alloc, hashbrown",
    "allocator, memcpy, libc",
    "other",
];

/// The group of a demangled function name.
fn group_of(function: &str) -> &'static str {
    let name = function.trim_start_matches(['<', '&', '*', ' ']);
    let name = name.strip_prefix("mut ").unwrap_or(name);
    let Some((krate, _)) = name.split_once("::") else {
        return GROUPS[6];
    };
    match krate {
        "sluice" => GROUPS[0],
        k if k.starts_with("pingora") => GROUPS[1],
        "tokio" => GROUPS[2],
        "http" | "httparse" | "bytes" => GROUPS[3],
        "prometheus" => GROUPS[4],
        "std" | "core" | "alloc" | "hashbrown" => GROUPS[5],
        _ => GROUPS[7],
    }
}

/// One case: what runs, and on which scenario.
struct Case {
    name: &'static str,
    scenario: &'static str,
    /// The case whose figure is this one's floor (an index into the list).
    floor: Option<usize>,
}

const CASES: [Case; 7] = [
    Case {
        name: "bare Pingora proxy",
        scenario: "allowed",
        floor: None,
    },
    Case {
        name: "sluice, no limit",
        scenario: "allowed",
        floor: Some(0),
    },
    Case {
        name: "sluice, backend: local",
        scenario: "allowed",
        floor: Some(1),
    },
    Case {
        name: "sluice + Redis, sliding_log",
        scenario: "allowed",
        floor: Some(2),
    },
    Case {
        name: "bare Pingora, fixed 429",
        scenario: "flood",
        floor: None,
    },
    Case {
        name: "sluice, backend: local",
        scenario: "flood",
        floor: Some(4),
    },
    Case {
        name: "sluice + Redis, sliding_log (deny cache)",
        scenario: "flood",
        floor: Some(4),
    },
];

/// A case's instructions per request, in all and by group.
struct Counted {
    requests: u64,
    total: f64,
    by_group: BTreeMap<&'static str, f64>,
}

pub fn run(options: &Options) -> String {
    let rig = Rig::start();
    let (dir, redis, upstream_port, script) =
        (&rig.dir, &rig.redis, rig.upstream_port, &rig.script);
    let mut counted = Vec::new();
    for (index, case) in CASES.iter().enumerate() {
        let out = dir.path().join(format!("overhead-{index}"));
        let file = match case.name {
            name if name.starts_with("bare") => {
                measure_bare(dir.path(), &out, upstream_port, case, script, options)
            }
            name => {
                let setup = Setup {
                    limited: !name.ends_with("no limit"),
                    backend: if name.contains("Redis") {
                        "redis"
                    } else {
                        "local"
                    },
                    ..Setup::redis_log(format!("o{index}:"), redis, upstream_port)
                };
                let sluice = setup.start(&callgrind_wrapper(dir.path(), &out, sluice_binary()));
                let url = format!("http://{}/bench", sluice.addr);
                warm_up(&url, script, case.scenario, || denies(&sluice));
                measure(sluice.pid(), &out, &url, script, case, options)
            }
        };
        let (file, requests) = file;
        let by_group = annotate(&file, requests);
        let total = by_group.values().sum();
        eprintln!(
            "overhead {:40} {:8} {total:>10.0} instructions/request over {requests} requests",
            case.name, case.scenario
        );
        counted.push(Counted {
            requests,
            total,
            by_group,
        });
    }
    table(options, &counted)
}

/// The bare Pingora proxy (or its fixed 429) under Callgrind, measured.
fn measure_bare(
    dir: &Path,
    out: &Path,
    upstream_port: u16,
    case: &Case,
    script: &Path,
    options: &Options,
) -> (PathBuf, u64) {
    let port = free_port();
    let deny = if case.scenario == "flood" { ",429" } else { "" };
    let spec = format!("127.0.0.1:{port},127.0.0.1:{upstream_port},1,false{deny}");
    let exe = std::env::current_exe().expect("current exe");
    let wrapper = callgrind_wrapper(dir, out, &exe);
    let daemon = Daemon::spawn(
        &format!("bare-callgrind-{port}"),
        Command::new(wrapper).args(["--bare", &spec]),
        dir,
    );
    wait_for_port(port);
    let url = format!("http://127.0.0.1:{port}/bench");
    warm_up(&url, script, case.scenario, || true);
    measure(daemon.child.id(), out, &url, script, case, options)
}

/// Zeroes the counters of `pid`, runs the case's wrk, and dumps them:
/// returns the dump's file and the requests wrk completed.
fn measure(
    pid: u32,
    out: &Path,
    url: &str,
    script: &Path,
    case: &Case,
    options: &Options,
) -> (PathBuf, u64) {
    control(pid, "--zero");
    let run = run_wrk(url, script, case.scenario, options.seconds, CONNECTIONS);
    (dump_file(pid, out), run.requests.max(1))
}

/// Exclusive instructions per request of a dump, by group. Read from the
/// dump itself: a cost line belongs to the function of the last `fn=`,
/// except the line after `calls=`, which is the callee's inclusive cost.
/// Names are compressed: `(id) name` the first time, `(id)` after, in
/// `fn=` and `cfn=` lines alike.
fn annotate(file: &Path, requests: u64) -> BTreeMap<&'static str, f64> {
    let text = std::fs::read_to_string(file).expect("read the Callgrind dump");
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut by_group: BTreeMap<&'static str, f64> = GROUPS.iter().map(|&g| (g, 0.0)).collect();
    let mut group = GROUPS[7];
    let mut after_call = false;
    for line in text.lines() {
        if let Some(reference) = line.strip_prefix("fn=") {
            group = group_of(function_name(&mut names, reference));
        } else if let Some(reference) = line.strip_prefix("cfn=") {
            function_name(&mut names, reference);
        } else if line.starts_with("calls=") {
            after_call = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
            if std::mem::take(&mut after_call) {
                continue;
            }
            let cost: u64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            *by_group.entry(group).or_default() += cost as f64 / requests as f64;
        }
    }
    by_group
}

/// The name a compressed reference `(id) name` or `(id)` stands for.
fn function_name<'t>(names: &mut HashMap<&'t str, &'t str>, reference: &'t str) -> &'t str {
    match reference.split_once(") ") {
        Some((id, given)) => {
            names.insert(id, given);
            given
        }
        None => names
            .get(reference.trim_end_matches(')'))
            .copied()
            .unwrap_or(""),
    }
}

fn table(options: &Options, counted: &[Counted]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**sluice's own cost in instructions**: `cargo bench --bench versus -- --parts overhead --seconds {seconds}` on {date}: {cpu}, {valgrind} (Callgrind).\n\n\
         Instructions per request of the serving process (one worker thread; every thread counted, the kernel not), wrk with {CONNECTIONS} connections \
         for {seconds} s per case after a warm-up; the last column is what a case adds to its floor, and the ratio. Allowed: 100,000 keys at random, none denied; \
         flood: one key, every measured request denied. sluice allocates with mimalloc, the bare proxy with glibc's malloc.\n",
        seconds = options.seconds,
        date = command_line("date", &["+%Y-%m-%d"]),
        cpu = cpu_model(),
        valgrind = command_line("valgrind", &["--version"]),
    );
    let _ = writeln!(
        out,
        "| case | scenario | requests | instructions per request | over its floor |\n|---|---|---|---|---|"
    );
    for (case, c) in CASES.iter().zip(counted) {
        let over = match case.floor {
            Some(floor) => {
                let f = &counted[floor];
                format!(
                    "+{:.0} ({:.2}× {})",
                    c.total - f.total,
                    c.total / f.total,
                    CASES[floor].name
                )
            }
            None => "the floor".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {over} |",
            case.name, case.scenario, c.requests, c.total
        );
    }
    let _ = writeln!(
        out,
        "\nWhere they went: each function's own instructions per request, by the crate that defines it (generic code instantiated by sluice counts in the crate that defines it: a `HashMap` lookup in `std`).\n"
    );
    let mut head = String::from("| crate |");
    let mut rule = String::from("|---|");
    for case in &CASES {
        let _ = write!(head, " {} ({}) |", case.name, case.scenario);
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{head}\n{rule}");
    for group in GROUPS {
        let mut row = format!("| {group} |");
        for c in counted {
            let _ = write!(
                row,
                " {:.0} |",
                c.by_group.get(group).copied().unwrap_or(0.0)
            );
        }
        let _ = writeln!(out, "{row}");
    }
    out
}
